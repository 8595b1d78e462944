"""What every run prints: the facts of the machine it ran on, and plain-text tables."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import math
import os
import platform
import shlex
import sys
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path

import redis


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, left: int = 1) -> str:
    """Fixed-width plain text: the first ``left`` columns left-aligned, the rest right."""
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i < left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def fmt(value: float, spec: str, missing: str = "n/a") -> str:
    """Format a number, or ``missing`` for NaN."""
    return missing if math.isnan(value) else format(value, spec)


def version(dist: str) -> str:
    """Installed version of a distribution, or 'absent'."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def load_average() -> str:
    """The load average, to show how busy the machine was besides this run."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def cpu_model() -> str:
    """The CPU's model name (Linux), or 'unknown CPU'."""
    with suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def machine_facts(
    client: redis.Redis,
    redis_url: str,
    private: bool,
    *,
    peers: bool = True,
    metrics: bool = True,
) -> list[str]:
    """The lines that say where and with what the numbers were measured.

    ``peers`` and ``metrics`` add the versions of the peer libraries and of
    prometheus-client: a script that runs neither the peers nor ``try_acquire`` (one
    that times Redis alone) leaves them out rather than print lines that do not concern
    its numbers.
    """
    from redis.utils import HIREDIS_AVAILABLE

    info = client.info("server")
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    where = "private, started by this run" if private else "existing, --redis-url"
    facts = [
        f"date:     {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC",
        f"command:  {shlex.join([sys.executable, *sys.argv])}",
        f"machine:  nproc {os.cpu_count()} (usable {affinity}), {cpu_model()}, "
        f"{platform.system()} {platform.release()}",
        f"python:   {platform.python_implementation()} {platform.python_version()}",
        f"redis:    redis-server {info.get('redis_version')} at {redis_url} ({where}); "
        f"redis-py {redis.__version__}; hiredis "
        + (f"yes ({version('hiredis')})" if HIREDIS_AVAILABLE else "no"),
    ]
    if peers:
        facts.append(
            f"peers:    limits {version('limits')}, pyrate-limiter {version('pyrate-limiter')}"
        )
    if metrics:
        facts.append(
            f"metrics:  prometheus-client {version('prometheus-client')} (recorded in the "
            "'gateway-limiter try_acquire' rows unless absent)"
        )
    facts.append(f"load:     {load_average()} (1/5/15-min load average at start)")
    return facts
