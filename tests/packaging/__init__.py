"""What ships works as shown: the wheel, the README and example code, the demo."""
