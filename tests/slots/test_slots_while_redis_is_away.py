"""Slots while Redis cannot be asked: ``on_backend_error`` decides them as it decides the
rate (``share``: maxConcurrent / N per process; ``local``: all of it; ``allow``, ``deny``);
and a slot Redis lost, or could not be told about, is never counted forever."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
import redis
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.backends.slots import slot_keys
from gateway_limiter.errors import Refused
from tests.support.limiting import write_row
from tests.support.services import RedisServer, TcpProxy, free_port
from tests.support.waiting import wait_for

URL = "/supplier/pay"


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    write_row(limiter_db[1], URL, rateLimit=1000, cache=0.05, maxConcurrent=4)
    return limiter_db


def _held(lim: GatewayLimiter, most: int) -> int:
    """How many slots one process gets, up to ``most``, each asked with a 50 ms budget."""
    with ExitStack() as stack:
        for n in range(most):
            try:
                stack.enter_context(lim.slot(URL, timeout=0.05))
            except Refused:
                return n
        return most


@pytest.mark.parametrize(
    ("policy", "fleet_size", "expected"),
    [
        ("share", 2, 2),  # 4 slots over 2 processes
        ("share", 3, 1),  # floor(4 / 3)
        ("share", 9, 1),  # at least 1 (docs/concurrency.md says why)
        ("share", 0, 4),  # N unknown: as local
        ("local", 2, 4),
        ("allow", 2, 10),  # no cap
    ],
)
def test_the_failure_policy_decides_slots_in_process(
    limiter_db: tuple[str, Engine], key_prefix: str, policy: str, fleet_size: int, expected: int
) -> None:
    with GatewayLimiter(
        database_url=limiter_db[0],
        redis_url=f"redis://127.0.0.1:{free_port()}/0",  # nothing listens there
        key_prefix=key_prefix,
        on_backend_error=policy,
        fleet_size=fleet_size,
        reload_interval=3600,
    ) as lim:
        assert _held(lim, 10) == expected
        assert not lim.backend_healthy


def test_deny_refuses_a_slot(limiter_db: tuple[str, Engine], key_prefix: str) -> None:
    with GatewayLimiter(
        database_url=limiter_db[0],
        redis_url=f"redis://127.0.0.1:{free_port()}/0",
        key_prefix=key_prefix,
        on_backend_error="deny",
        reload_interval=3600,
    ) as lim:
        with pytest.raises(Refused) as refused, lim.slot(URL):
            pytest.fail("deny let a call in")
        assert refused.value.decision.reason == "backend_fallback"


@pytest.fixture
def proxy(private_redis: RedisServer) -> Iterator[TcpProxy]:
    relay = TcpProxy("127.0.0.1", private_redis.port).start()
    yield relay
    relay.cut()


def test_a_slot_whose_release_could_not_be_sent_lapses_within_a_lease(
    limiter_db: tuple[str, Engine], key_prefix: str, proxy: TcpProxy, private_redis: RedisServer
) -> None:
    lease_s = 1.0
    watcher = private_redis.client()
    leases = slot_keys(key_prefix, URL)[0]
    with GatewayLimiter(
        database_url=limiter_db[0],
        redis_url=f"redis://127.0.0.1:{proxy.port}/0",
        key_prefix=key_prefix,
        slot_lease=lease_s,
        breaker_seconds=0.2,
        reload_interval=3600,
    ) as lim:
        with lim.slot(URL):
            assert watcher.zcard(leases) == 1
            proxy.cut()  # the release fails: it is logged nowhere, raised never
        cut_at = time.monotonic()
        proxy.restore()

        def dropped() -> bool:  # past the breaker, Redis is asked again: each look
            lim.in_flight(URL)  # drops the lapsed leases, as every slot call does
            return watcher.zcard(leases) == 0

        wait_for(dropped, lease_s + 3, "the lapsed lease dropped")
        gone_s = time.monotonic() - cut_at
        assert gone_s <= lease_s + 1.0
        assert _held(lim, 10) == 4  # all four slots to be had again


def test_a_redis_restart_mid_call_leaves_no_slot_counted(
    limiter_db: tuple[str, Engine], key_prefix: str, private_redis: RedisServer
) -> None:
    with GatewayLimiter(
        database_url=limiter_db[0],
        redis_url=private_redis.url,
        key_prefix=key_prefix,
        breaker_seconds=0.1,
        reload_interval=3600,
    ) as lim:
        with lim.slot(URL):
            private_redis.kill()
            private_redis.start()  # empty: the lease is gone with the old server
        # releasing a lease the new server never knew was harmless; all four are free

        def probed() -> bool:  # past the breaker's 0.1 s, a look asks the new server
            lim.in_flight(URL)
            return lim.backend_healthy

        wait_for(probed, 5, "a look to close the breaker")
        assert _held(lim, 10) == 4
        client: redis.Redis = private_redis.client()
        assert client.zcard(slot_keys(key_prefix, URL)[0]) == 0


def test_a_slot_wait_ends_on_time_however_often_redis_is_probed(
    limiter_db: tuple[str, Engine], key_prefix: str
) -> None:
    with (
        GatewayLimiter(
            database_url=limiter_db[0],
            redis_url=f"redis://127.0.0.1:{free_port()}/0",
            key_prefix=key_prefix,
            on_backend_error="local",
            breaker_seconds=0.0,  # every attempt probes Redis again
            reload_interval=3600,
        ) as lim,
        ExitStack() as stack,
    ):
        for _ in range(4):
            stack.enter_context(lim.slot(URL, timeout=0.05))
        started = time.monotonic()
        with pytest.raises(Refused), lim.slot(URL, timeout=0.2):
            pytest.fail("a fifth call went in beside four")
        assert 0.19 <= time.monotonic() - started < 2.0


@pytest.mark.parametrize("policy", ["local", "share"])
def test_slots_held_through_redis_count_against_the_outage_part(
    limiter_db: tuple[str, Engine], key_prefix: str, proxy: TcpProxy, policy: str
) -> None:
    """3 of 4 slots taken through Redis and still in flight when it goes away: the
    process's part during the outage (the whole cap: it is the fleet's one member)
    counts them, so it takes 1 more, not 4 beside them (found by the simulated fleet,
    seed 70)."""
    with (
        GatewayLimiter(
            database_url=limiter_db[0],
            redis_url=f"redis://127.0.0.1:{proxy.port}/0",
            key_prefix=key_prefix,
            on_backend_error=policy,
            breaker_seconds=30,
            reload_interval=3600,
        ) as lim,
        ExitStack() as through_redis,
    ):
        for _ in range(3):
            through_redis.enter_context(lim.slot(URL, timeout=0.05))
        assert lim.backend_healthy
        assert lim.fleet_size == 1
        proxy.cut()
        assert _held(lim, 10) == 1
        assert not lim.backend_healthy
