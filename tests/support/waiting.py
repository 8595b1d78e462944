"""Waiting for a state instead of sleeping for it (issue 31): poll a condition until it
holds, failing the test with what was awaited once a deadline passes.

A fixed sleep is either too short on a loaded 2-core host (the state is not there yet)
or too long everywhere else; a poll returns as soon as the state is there and waits
longer only when the host is slow. tests/packaging/test_tests_wait_on_clocks_or_events.py
holds every other sleep in the tests to a reason of real time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")

#: Seconds between two looks: short beside any state a test awaits, long beside a look.
EVERY_S = 0.02


def wait_for(
    condition: Callable[[], T], seconds: float, what: str = "", every: float = EVERY_S
) -> T:
    """Poll ``condition()`` until it answers something true, and return that answer;
    fail the test (naming ``what``) if it has not after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not (found := condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"not within {seconds} s: {what or condition}")
        time.sleep(every)
    return found


async def wait_for_async(
    condition: Callable[[], T], seconds: float, what: str = "", every: float = EVERY_S
) -> T:
    """``wait_for`` on an event loop: the loop runs between the looks."""
    deadline = time.monotonic() + seconds
    while not (found := condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"not within {seconds} s: {what or condition}")
        await asyncio.sleep(every)
    return found
