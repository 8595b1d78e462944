"""What the OS took from this process: the seconds each of its threads spent runnable
but waiting for a CPU (the run-queue time, the second field of
/proc/self/task/<tid>/schedstat).

On a shared 2-core host other work can keep a thread off the CPU for a hundred
milliseconds and more. A timing test subtracts that from the wall-clock time it
measured, so that what is left is what the code under test did (ran, blocked in a call,
waited for a reply), not how busy the host was. Every thread counts, not only the one
measured: a thread the OS stops while it holds the GIL or a lock holds the others up
just as long.

Where the file does not exist (not Linux, schedstats off) nothing is subtracted: the
test then measures wall-clock time, as before.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def run_queues() -> dict[str, float]:
    """Per thread of this process (by task id): seconds spent waiting for a CPU so far."""
    queued = {}
    with contextlib.suppress(OSError):
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError, IndexError, ValueError):  # the thread ended
                text = Path(f"/proc/self/task/{tid}/schedstat").read_text()
                queued[tid] = int(text.split()[1]) / 1e9
    return queued


def waited_since(before: dict[str, float]) -> dict[str, float]:
    """Per thread: seconds spent waiting for a CPU since ``run_queues()`` gave ``before``
    (a thread started since waited only since; one that ended since is left out)."""
    return {tid: s - before.get(tid, 0.0) for tid, s in run_queues().items()}


def off_cpu_since(before: dict[str, float]) -> float:
    """Seconds this process's threads spent waiting for a CPU since ``before``, added up."""
    return sum(waited_since(before).values(), 0.0)
