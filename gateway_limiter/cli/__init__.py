"""The command line: ``gateway-limiter`` and ``python -m gateway_limiter``."""

from gateway_limiter.cli.app import main

__all__ = ["main"]
