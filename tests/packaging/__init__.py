"""What ships works as shown: the wheel, the code in the README and the docs, the examples,
the demo."""
