"""What surrounds a run: ``kill`` handled like Ctrl-C, the limiter's errors counted,
and the run's keys removed from a shared Redis."""

from __future__ import annotations

import logging
from types import FrameType

import redis


def raise_interrupt(signum: int, frame: FrameType | None) -> None:
    """A signal handler that raises KeyboardInterrupt, so cleanup runs as on Ctrl-C."""
    raise KeyboardInterrupt(f"signal {signum}")


class ErrorLog(logging.Handler):
    """Counts the limiter's ERROR records (each one is a circuit-breaker opening)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        """Count one record."""
        self.count += 1


def delete_keys(client: redis.Redis, pattern: str) -> None:
    """On a shared Redis, remove every key matching ``pattern`` (the run's own)."""
    for key in client.scan_iter(match=pattern, count=1000):
        client.delete(key)
