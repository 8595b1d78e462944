"""``slot(priority=...)`` on a real Redis: a row's reserve is also a share of its
``maxConcurrent`` that a lower class leaves free for the classes above it, and a lower
class takes no place in the queue ahead of a critical caller."""

from __future__ import annotations

from contextlib import ExitStack

import pytest
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter, Refused
from tests.support.limiting import write_row


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    write_row(
        limiter_db[1],
        "/s/fares",
        rateLimit=1000,
        cache=0.0,
        maxConcurrent=4,
        reserve="sheddable=0.5",
    )
    return limiter_db


def test_a_lower_class_leaves_its_share_of_the_slots(lim: GatewayLimiter) -> None:
    with ExitStack() as held:
        for _ in range(2):
            decision = held.enter_context(lim.slot("/s/fares", timeout=0, priority="sheddable"))
            assert decision.priority == "sheddable"
        with pytest.raises(Refused, match="no free slot"):
            held.enter_context(lim.slot("/s/fares", timeout=0, priority="sheddable"))
        for _ in range(2):  # the row's class, default: the reserve is for it
            held.enter_context(lim.slot("/s/fares", timeout=0))
        with pytest.raises(Refused):
            held.enter_context(lim.slot("/s/fares", timeout=0, priority="critical"))
        assert lim.in_flight("/s/fares") == 4
    assert lim.in_flight("/s/fares") == 0


def test_a_lower_class_waits_without_a_place_and_takes_a_freed_slot(lim: GatewayLimiter) -> None:
    with ExitStack() as held:
        for _ in range(2):
            held.enter_context(lim.slot("/s/fares", timeout=0, priority="sheddable"))
        first = ExitStack()
        first.enter_context(lim.slot("/s/fares", timeout=0, priority="critical"))
        first.close()  # a slot frees at once: a sheddable call still finds only its share
        with pytest.raises(Refused):
            held.enter_context(lim.slot("/s/fares", timeout=0.2, priority="sheddable"))
    with lim.slot("/s/fares", timeout=0, priority="sheddable") as decision:
        assert decision.allowed
