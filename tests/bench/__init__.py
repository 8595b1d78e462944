"""The benchmark scripts still run to their tables."""
