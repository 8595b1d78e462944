"""The gateway-limiter command line: conf and switch round trips, errors, status."""
