"""While Redis is stopped, ``slot()`` takes this process's in-process slots, and a
class below critical leaves its share of them free, as ``slot.lua`` does on Redis: a
row's reserve ``sheddable=0.5`` over ``maxConcurrent`` 4 lets searches hold 2, the
classes above them the rest. Under ``on_backend_error`` ``local`` (the whole cap in
this process) and ``share`` (its part of it: here the only process, all of it)."""

from __future__ import annotations

from contextlib import ExitStack

import pytest
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter, Refused
from tests.support.limiting import write_row
from tests.support.services import RedisServer


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    write_row(
        limiter_db[1],
        "/away/fares",
        rateLimit=1000,
        cache=0.0,
        maxConcurrent=4,
        reserve="sheddable=0.5",
    )
    return limiter_db


@pytest.mark.parametrize("policy", ["local", "share"])
def test_searches_leave_their_share_of_the_slots_while_redis_is_stopped(
    limiter_db: tuple[str, Engine], private_redis: RedisServer, key_prefix: str, policy: str
) -> None:
    lim = GatewayLimiter(
        database_url=limiter_db[0],
        redis_url=private_redis.url,
        key_prefix=key_prefix,
        on_backend_error=policy,
        redis_connect_timeout=0.2,
    )
    with lim:
        with lim.slot("/away/fares", timeout=0, priority="sheddable") as decision:
            assert decision.reason == "admitted"  # Redis answers: slot.lua
        private_redis.kill()
        with ExitStack() as held:
            for _ in range(2):
                decision = held.enter_context(
                    lim.slot("/away/fares", timeout=0, priority="sheddable")
                )
                assert decision.reason == "backend_fallback"
            with pytest.raises(Refused):
                held.enter_context(lim.slot("/away/fares", timeout=0, priority="sheddable"))
            for _ in range(2):  # the row's class, default: the reserve is for it
                held.enter_context(lim.slot("/away/fares", timeout=0))
            with pytest.raises(Refused):
                held.enter_context(lim.slot("/away/fares", timeout=0, priority="critical"))
            assert lim.in_flight("/away/fares") == 4
        # given back: a search finds its share free again
        with lim.slot("/away/fares", timeout=0, priority="sheddable") as decision:
            assert decision.allowed


def test_memory_backend_slots_keep_the_class_order(
    limiter_db: tuple[str, Engine], key_prefix: str
) -> None:
    with (
        GatewayLimiter(
            database_url=limiter_db[0], redis_url="memory://", key_prefix=key_prefix
        ) as lim,
        ExitStack() as held,
    ):
        for _ in range(2):
            held.enter_context(lim.slot("/away/fares", timeout=0, priority="sheddable"))
        with pytest.raises(Refused):
            held.enter_context(lim.slot("/away/fares", timeout=0, priority="sheddable"))
        for _ in range(2):
            held.enter_context(lim.slot("/away/fares", timeout=0, priority="critical"))
        assert lim.in_flight("/away/fares") == 4
