"""Redis killed, restarted, paused or flushed under load: callers see no exception, no call
stalls past about ``redis_timeout``, the policy decides meanwhile, and sharing resumes."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import pytest
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.backends.state import bucket_key
from tests.support.limiting import evalsha_calls, limiter, write_row
from tests.support.services import RedisServer
from tests.support.waiting import wait_for

REDIS_TIMEOUT = 0.05
#: A call may take the socket timeout plus scheduling noise on a loaded 2-core host.
CALL_BOUND = REDIS_TIMEOUT + 0.45


@dataclass
class Load:
    """Threads calling try_acquire in a loop, recording outcomes by phase."""

    lim: GatewayLimiter
    url: str
    phase: str = "before"
    errors: list[BaseException] = field(default_factory=list)
    slowest: float = 0.0
    outcomes: dict[str, list[bool]] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            phase = self.phase
            start = time.monotonic()
            try:
                ok = self.lim.try_acquire(self.url, timeout=0)
            except BaseException as e:
                self.errors.append(e)
                continue
            self.slowest = max(self.slowest, time.monotonic() - start)
            self.outcomes.setdefault(phase, []).append(ok)
            time.sleep(0.002)

    def __enter__(self) -> Load:
        self.threads = [threading.Thread(target=self.run) for _ in range(4)]
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(5)

    def called(self, phase: str, calls: int = 20) -> bool:
        """At least ``calls`` decided in ``phase``."""
        return len(self.outcomes.get(phase, ())) >= calls


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["local", "allow", "deny"])
def test_redis_killed_and_restarted_under_load(
    policy: str, migrated_db: tuple[str, Engine], private_redis: RedisServer, key_prefix: str
) -> None:
    url, engine = migrated_db
    write_row(engine, "/r", rateLimit=20, cache=0.0, status=1)
    lim = limiter(
        url,
        private_redis.url,
        key_prefix,
        on_backend_error=policy,
        redis_timeout=REDIS_TIMEOUT,
        breaker_seconds=0.3,
        reload_interval=60,
    )
    try:
        with Load(lim, "/r") as load:
            wait_for(lambda: load.called("before"), 5, "traffic decided on Redis")
            load.phase = "noticing"
            private_redis.kill()
            # Until the next permit the last reply named (50 ms at most), callers are
            # refused in-process as Redis would have refused them: nobody asks it yet.
            wait_for(lambda: not lim.backend_healthy, 2)
            load.phase = "outage"
            time.sleep(1.5)  # real time: traffic through the outage, its bound counts 1.5 s
            load.phase = "after"
            private_redis.start()
            wait_for(lambda: lim.backend_healthy, 5)
            load.phase = "rejoined"
            started = time.monotonic()
            time.sleep(1.2)  # real time: traffic on Redis' bucket, bounded by its seconds
            rejoined_for = time.monotonic() - started
        assert load.errors == []
        assert load.slowest < CALL_BOUND
        assert lim.backend_fallbacks > 0  # the policy, not Redis, decided the outage
        outage = load.outcomes["outage"]
        if policy == "allow":
            assert all(outage)
        elif policy == "deny":
            # calls in flight at the kill may still have been decided by Redis
            assert sum(outage) <= 20
        else:  # local: the same limit, this process alone, over ~1.5 s
            assert 5 <= sum(outage) <= 20 + 20 * 1.5 + 20 + 5
        # shared state resumed: the bucket lives in the restarted Redis
        assert private_redis.client().exists(bucket_key(key_prefix, "/r"))
        # back on the shared bucket: a fresh (full) bucket plus the rate, no more
        assert sum(load.outcomes["rejoined"]) <= 20 + 20 * (rejoined_for + CALL_BOUND)
    finally:
        lim.close()


@pytest.mark.slow
def test_redis_paused_longer_than_the_timeout_never_stalls_a_call(
    migrated_db: tuple[str, Engine], private_redis: RedisServer, key_prefix: str
) -> None:
    url, engine = migrated_db
    write_row(engine, "/r", rateLimit=1000, cache=0.0, status=1)
    lim = limiter(
        url,
        private_redis.url,
        key_prefix,
        redis_timeout=REDIS_TIMEOUT,
        breaker_seconds=0.2,
        reload_interval=60,
    )
    admin = private_redis.client()
    try:
        with Load(lim, "/r") as load:
            wait_for(lambda: load.called("before"), 5, "traffic decided on Redis")
            admin.client_pause(1000, all=True)
            wait_for(lambda: not lim.backend_healthy, 2, "the pause noticed")
            wait_for(lambda: lim.backend_healthy, 5, "Redis answering again")
        assert load.errors == []
        assert load.slowest < CALL_BOUND
        assert lim.backend_healthy
    finally:
        lim.close()


def test_script_flush_mid_traffic_costs_one_reload_not_an_error(
    migrated_db: tuple[str, Engine], private_redis: RedisServer, key_prefix: str
) -> None:
    url, engine = migrated_db
    write_row(engine, "/r", rateLimit=1000, cache=0.0, status=1)
    lim = limiter(url, private_redis.url, key_prefix, reload_interval=60)
    admin = private_redis.client()
    try:
        assert lim.try_acquire("/r")
        admin.script_flush()
        before = evalsha_calls(admin)
        assert all(lim.try_acquire("/r") for _ in range(10))
        assert lim.backend_healthy
        assert evalsha_calls(admin) == before + 11  # one NOSCRIPT, then ten decisions
    finally:
        lim.close()


def test_redis_restarted_empty_recreates_the_bucket_full(
    migrated_db: tuple[str, Engine], private_redis: RedisServer, key_prefix: str
) -> None:
    url, engine = migrated_db
    # 5 saved up, refilled at 1/s: a loaded host's stalls between the calls refill nothing
    write_row(engine, "/r", rateLimit=1, maxPermits=5, cache=0.0, status=1)
    lim = limiter(url, private_redis.url, key_prefix, reload_interval=60, breaker_seconds=0.1)
    try:
        assert [lim.try_acquire("/r") for _ in range(6)] == [True] * 5 + [False]
        private_redis.client().flushall()
        # Redis lost the state with no error this process could see: until the moment
        # the last reply gave (the next permit, a second after the first call) it still
        # refuses in-process, stricter than the empty Redis, never looser.
        assert not lim.try_acquire("/r")
        time.sleep(1.1)  # real time: Redis' clock refills the permit the refusal named
        assert [lim.try_acquire("/r") for _ in range(6)] == [True] * 5 + [False]
    finally:
        lim.close()


def test_redis_down_at_start_starts_anyway_and_joins_when_it_comes_up(
    migrated_db: tuple[str, Engine], private_redis: RedisServer, key_prefix: str
) -> None:
    url, engine = migrated_db
    write_row(engine, "/r", rateLimit=1, maxPermits=3, cache=0.0, status=1)  # refills 1/s
    private_redis.kill()
    lim = limiter(url, private_redis.url, key_prefix, reload_interval=60, breaker_seconds=0.1)
    try:
        assert not lim.backend_healthy
        assert [lim.try_acquire("/r") for _ in range(4)] == [True] * 3 + [False]  # local
        private_redis.start()

        def probed() -> bool:  # past the breaker's 0.1 s, a call asks the restarted Redis
            lim.try_acquire("/r")
            return lim.backend_healthy

        wait_for(probed, 5, "a call to close the breaker")
        assert private_redis.client().exists(bucket_key(key_prefix, "/r"))
    finally:
        lim.close()
