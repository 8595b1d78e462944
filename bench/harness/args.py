"""What the scripts' command lines share: the description ``--help`` prints, option
types that refuse a count or a duration no run can use, and the first check of a
``--redis-url`` (one line naming the URL, not a traceback from deep in a run)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import redis

from gateway_limiter.observe.redact import mask_secrets, mask_url


def description(doc: str | None) -> str:
    """A script's docstring's first paragraph, on one line: whole sentences for ``--help``
    (its first line alone may stop mid-sentence)."""
    return " ".join((doc or "").strip().split("\n\n", 1)[0].split())


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer no smaller than ``low``; an error naming the value
    given otherwise (argparse prefixes the option and exits 2)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value}: must be >= {low}")
        return value

    parse.__name__ = f"integer >= {low}"  # what argparse names in its own messages
    return parse


positive_int = int_at_least(1)


def positive_float(text: str) -> float:
    """An argparse ``type``: a finite number above 0 (a duration, a rate)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text}: must be > 0")
    return value


def reachable_redis(url: str, option: str = "--redis-url") -> None:
    """Exit 1 with one line naming ``url`` (its password masked) when no Redis answers
    there; a run would otherwise fail later with a traceback from the first command."""
    try:
        client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        try:
            client.ping()
        finally:
            client.close()
    except (redis.RedisError, ValueError, OSError) as exc:
        detail = mask_secrets(" ".join(str(exc).split())) or type(exc).__name__
        script = Path(sys.argv[0]).name
        raise SystemExit(
            f"{script}: error: {option} {mask_url(url)}: cannot reach Redis: {detail}"
        ) from None
