"""How the library logs: the ``gateway_limiter`` logger, one line per event, no secrets,
and repeats of the same event rate-limited.

Everything the library logs goes to ``logging.getLogger("gateway_limiter")`` (configure
that logger, or the root logger, to see it). A line is one event: text from outside
(an error message from a driver, a URL) is flattened to one line and has passwords
masked. An event that can repeat without bound (a shadow rule refusing, Redis or the
database flapping) is logged at most once per interval per kind; the next line says
how many were held back, so nothing is lost from the count.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable

from gateway_limiter.observe.redact import mask_secrets

LOGGER_NAME = "gateway_limiter"
log = logging.getLogger(LOGGER_NAME)

#: Outages (Redis, the database) that come and go: at most one report per this many s.
OUTAGE_REPORT_SECONDS = 60.0
#: Refusals a shadow rule would have made: at most one line per interface this often.
SHADOW_REPORT_SECONDS = 10.0


#: Characters of outside text one line keeps at most (the rest is cut, marked "...").
LINE_LIMIT = 300
# Where a client library pastes an object's repr into its message, e.g. redis-py's
# "No master found for 'x' : <redis.asyncio.client.Redis(<...ConnectionPool(<...>)>)>",
# 1,500 characters of pool and connection settings that say nothing about the failure.
_OBJECT_REPR = re.compile(r"\s*[:,;-]?\s*<[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+(?:\(| object at 0x)")


def one_line(text: str, limit: int = LINE_LIMIT) -> str:
    """``text`` as one short line of a log: passwords masked, newlines and runs of spaces
    folded, and what follows an object's repr (``<module.Class(...``), or anything past
    ``limit`` characters, cut and marked with "...".
    """
    line = " ".join(mask_secrets(text).split())  # masked whole, before anything is cut
    cut = _OBJECT_REPR.search(line)
    if cut is not None:
        line = line[: cut.start()] + " ..."
    if len(line) > limit:
        line = line[: max(0, limit - 4)].rstrip() + " ..."
    return line


def held_back(count: int) -> str:
    """The suffix that tells how many like events were not logged since the last line."""
    return f" ({count} more since the last report)" if count else ""


class Throttle:
    """At most one line per key every ``seconds``; counts the events it holds back.

    Keys must come from a bounded set (rule URLs, fixed names), never from callers.
    """

    __slots__ = ("_clock", "_held", "_last", "_lock", "_seconds")

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._seconds = seconds
        self._clock = clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def ready(self, key: str) -> int | None:
        """None: stay quiet (the event is counted). Otherwise log now: the number of
        events held back since the last line for ``key``."""
        now = self._clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self._seconds:
                self._held[key] = self._held.get(key, 0) + 1
                return None
            self._last[key] = now
            return self._held.pop(key, 0)
