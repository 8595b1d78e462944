"""What the limiter tells people: Prometheus metrics and log lines."""
