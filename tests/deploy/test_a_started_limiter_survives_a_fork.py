"""A limiter started before ``os.fork`` (gateway_limiter/lifecycle.py): the child gets
a limiter of its own that reloads, renews its slots, and joins the fleet with its first
decision; the parent leaves the fleet at the fork and rejoins with its next decision.
Threaded and asyncio, on real MariaDB and Redis.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import pytest
from sqlalchemy import Engine, make_url

from gateway_limiter import GatewayLimiter
from gateway_limiter.aio import AsyncGatewayLimiter
from tests.support.deploy import fleet_pids, limiter_env, poll
from tests.support.limiting import write_row
from tests.support.services import TcpProxy

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

URL = "/sup/forked"
SLOT_URL = "/sup/one-at-a-time"
SLOT_LEASE_S = 1.0
RELOAD_S = 1.0
REACHED_WITHIN_S = RELOAD_S * 1.1 + 1.0


@pytest.fixture
def limiter_settings() -> dict[str, Any]:
    return {
        "reload_interval": RELOAD_S,
        "fleet_heartbeat": 0.5,
        "redis_timeout": 2.0,
        "slot_lease": SLOT_LEASE_S,
    }


@pytest.fixture
def limiter_db(limiter_db: tuple[str, Engine]) -> tuple[str, Engine]:
    write_row(limiter_db[1], URL, rateLimit=1000, cache=0)
    write_row(limiter_db[1], SLOT_URL, rateLimit=1000, cache=0, maxConcurrent=1)
    return limiter_db


def in_child(report: int, work: Any) -> None:
    """Run ``work()`` in the forked child, write its JSON answer to ``report``, exit."""
    code = 1
    try:
        os.write(report, json.dumps(work()).encode())
        code = 0
    finally:
        os._exit(code)


def threaded_child(lim: GatewayLimiter, go: int) -> dict[str, Any]:
    """Once the parent says go, decide until the row's new rate shows."""
    os.read(go, 1)
    first = lim.decide(URL, timeout=0)
    started = time.monotonic()
    while (decision := lim.decide(URL, timeout=0)).limit != 2000:
        if time.monotonic() - started > 15:
            break
        time.sleep(0.05)
    return {
        "first": first.limit,
        "last": decision.limit,
        "beating": lim._heartbeats is not None and lim._heartbeats.alive,
        "member": f'"pid":{os.getpid()}' in lim._fleet.member.replace(" ", ""),
    }


def async_child(alim: AsyncGatewayLimiter) -> dict[str, Any]:
    async def decide_until_changed() -> dict[str, Any]:
        first = await alim.decide(URL, timeout=0)
        started = time.monotonic()
        while (decision := await alim.decide(URL, timeout=0)).limit != 2000:
            if time.monotonic() - started > 15:
                break
            await asyncio.sleep(0.05)
        beating = alim._heartbeats is not None and alim._heartbeats.alive
        await alim.aclose()  # on the child's own loop: leaves the fleet
        return {"first": first.limit, "last": decision.limit, "beating": beating}

    return asyncio.run(decide_until_changed())


def wait_child(pid: int, report: int) -> dict[str, Any]:
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    answer: dict[str, Any] = json.loads(os.read(report, 65536))
    return answer


def test_a_threaded_limiter_started_before_a_fork_runs_anew_in_the_child(
    lim: GatewayLimiter, limiter_db: tuple[str, Engine], limiter_redis_url: str, key_prefix: str
) -> None:
    env = limiter_env(limiter_db[0], limiter_redis_url, key_prefix)
    assert lim.decide(URL, timeout=0).allowed
    assert poll(lambda: fleet_pids(env) == {os.getpid()}, 5)
    read, write = os.pipe()
    go_read, go = os.pipe()
    pid = os.fork()
    if pid == 0:
        in_child(write, lambda: threaded_child(lim, go_read))
    os.close(write)
    # the parent only forked, the child has not decided yet: neither is in the fleet
    assert poll(lambda: fleet_pids(env) == set(), 10), fleet_pids(env)
    os.write(go, b"!")
    assert poll(lambda: fleet_pids(env) == {pid}, 10), fleet_pids(env)
    write_row(limiter_db[1], URL, rateLimit=2000)
    changed_at = time.monotonic()
    answer = wait_child(pid, read)
    assert time.monotonic() - changed_at < REACHED_WITHIN_S + 0.5
    assert answer == {"first": 1000, "last": 2000, "beating": True, "member": True}
    # the parent decides again: it rejoins the fleet
    assert lim.decide(URL, timeout=0).allowed
    assert poll(lambda: os.getpid() in fleet_pids(env), 5), fleet_pids(env)


async def test_an_asyncio_limiter_started_before_a_fork_runs_anew_in_the_child(
    alim: AsyncGatewayLimiter, limiter_db: tuple[str, Engine], limiter_redis_url: str,
    key_prefix: str,
) -> None:  # fmt: skip
    env = limiter_env(limiter_db[0], limiter_redis_url, key_prefix)
    assert (await alim.decide(URL, timeout=0)).allowed

    def fleet() -> set[int]:
        return fleet_pids(env)

    assert await asyncio.to_thread(poll, lambda: fleet() == {os.getpid()}, 5)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        in_child(write, lambda: async_child(alim))
    os.close(write)
    assert await asyncio.to_thread(poll, lambda: fleet() == {pid}, 10), fleet()
    write_row(limiter_db[1], URL, rateLimit=2000)
    answer = await asyncio.to_thread(wait_child, pid, read)
    assert answer == {"first": 1000, "last": 2000, "beating": True}
    assert await asyncio.to_thread(poll, lambda: fleet() == set(), 5), fleet()  # it left
    # The parent reloads still, on its own schedule: a loaded host may delay its turn.
    deadline = time.monotonic() + 10 * RELOAD_S
    while (await alim.decide(URL, timeout=0)).limit != 2000:
        assert time.monotonic() < deadline, "the parent stopped following the table"
        await asyncio.sleep(RELOAD_S / 4)
    assert await asyncio.to_thread(poll, lambda: fleet() == {os.getpid()}, 5), fleet()


def test_a_forked_child_renews_its_own_slots(lim: GatewayLimiter) -> None:
    """The parent's slot renewer is a thread the child lacks: the child starts its own,
    so a slot it holds past its lease stays held."""
    with lim.slot(SLOT_URL):  # the parent's renewer thread runs from here on
        pass
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:

        def hold_past_the_lease() -> dict[str, Any]:
            with lim.slot(SLOT_URL, timeout=0):
                # real time: the lease lapses on Redis' clock unless renewed
                time.sleep(2.5 * SLOT_LEASE_S)
                return {"in_flight": lim.in_flight(SLOT_URL)}

        in_child(write, hold_past_the_lease)
    os.close(write)
    assert wait_child(pid, read) == {"in_flight": 1}
    assert lim.in_flight(SLOT_URL) == 0  # given back as the child's block ended


def test_a_child_forked_while_the_database_is_down_decides_by_the_parents_limits(
    limiter_db: tuple[str, Engine], limiter_redis_url: str, key_prefix: str
) -> None:
    """The last good limits go with the fork, as a value: a child whose first reload
    fails still limits, and follows the table once the database is back."""
    url, engine = limiter_db
    real = make_url(url)
    proxy = TcpProxy(real.host or "127.0.0.1", real.port or 3306).start()
    proxied = real.set(host="127.0.0.1", port=proxy.port).render_as_string(False)
    parent = GatewayLimiter(
        database_url=proxied, redis_url=limiter_redis_url, key_prefix=key_prefix,
        reload_interval=RELOAD_S, redis_timeout=2.0,
    )  # fmt: skip
    try:
        parent.start()
        assert parent.decide(URL, timeout=0).limit == 1000
        proxy.cut()  # the database is away at the fork
        read, write = os.pipe()
        decided, said = os.pipe()
        pid = os.fork()
        if pid == 0:

            def decide_by_what_was_known() -> dict[str, Any]:
                first = parent.decide(URL, timeout=0).limit
                os.write(said, b"!")  # the parent brings the database back now
                started = time.monotonic()
                while (limit := parent.decide(URL, timeout=0).limit) != 2000:
                    if time.monotonic() - started > 20:
                        break
                    time.sleep(0.05)
                return {"first": first, "last": limit}

            in_child(write, decide_by_what_was_known)
        os.close(write)
        assert os.read(decided, 1) == b"!"
        write_row(engine, URL, rateLimit=2000)
        proxy.restore()
        assert wait_child(pid, read) == {"first": 1000, "last": 2000}
    finally:
        parent.close()
        proxy.cut()
