"""What the limiter shows: decisions and headers, metrics, logs."""
