"""``gateway_limiter.aio.try_acquire``/``acquire``: one limiter per process, built lazily
from settings on the running loop, once even when the first callers come together;
handed to a new loop once the old one has ended; refused to a second running loop."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from gateway_limiter import aio
from gateway_limiter.config.migrate import upgrade
from gateway_limiter.config.table import make_engine, upsert_conf
from tests.support.limiting import write_row
from tests.support.services import RedisServer


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts with no process-wide limiter, and its settings from the env."""
    monkeypatch.setattr(aio, "_process", aio._ProcessWide())
    monkeypatch.delenv("GATEWAY_LIMITER_SETTINGS", raising=False)
    monkeypatch.setenv("GATEWAY_LIMITER_RELOAD_INTERVAL", "60")
    yield


@pytest.fixture
def sqlite_limits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = f"sqlite:///{tmp_path / 'limits.db'}"
    engine = make_engine(db)
    upgrade(engine)
    # 5 saved up, refilled at 1/s: a loaded host's stalls between the calls counted on
    # it refill nothing
    upsert_conf(engine, "/m", rate_limit=1, max_permits=5, cache=0.0, status=1)
    engine.dispose()
    monkeypatch.setenv("GATEWAY_LIMITER_DATABASE_URL", db)
    monkeypatch.setenv("GATEWAY_LIMITER_REDIS_URL", "memory://")


async def test_first_callers_together_build_one_limiter_from_settings(
    migrated_db: tuple[str, Engine],
    redis_server: RedisServer,
    key_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, engine = migrated_db
    write_row(engine, "/m", rateLimit=5, cache=0.0, status=1)
    monkeypatch.setenv("GATEWAY_LIMITER_DATABASE_URL", url)
    monkeypatch.setenv("GATEWAY_LIMITER_REDIS_URL", redis_server.url)
    monkeypatch.setenv("GATEWAY_LIMITER_KEY_PREFIX", key_prefix)
    built: list[aio.AsyncGatewayLimiter] = []

    class Counted(aio.AsyncGatewayLimiter):
        __slots__ = ()

        def __init__(self) -> None:
            super().__init__()
            built.append(self)

    monkeypatch.setattr(aio, "AsyncGatewayLimiter", Counted)
    try:
        started = time.monotonic()
        admitted = await asyncio.gather(*(aio.try_acquire("/m") for _ in range(50)))
        took = time.monotonic() - started
        assert len(built) == 1
        lim = await aio.default_limiter()
        assert lim is built[0] and lim is await aio.default_limiter()
        assert lim.settings.key_prefix == key_prefix and lim.backend.shared
        assert 5 <= sum(admitted) <= 5 + 5 * took + 1  # 5 stored, and what refilled meanwhile
        assert await aio.acquire("/m") <= 0.2 + 0.01  # the next permit, at 5/s
    finally:
        await aio.aclose_default()


def test_a_new_event_loop_gets_a_new_limiter_once_the_old_one_has_ended(
    sqlite_limits: None,
) -> None:
    async def use(close: bool = False) -> aio.AsyncGatewayLimiter:
        assert await aio.try_acquire("/m")
        lim = await aio.default_limiter()
        if close:
            # on its own loop: aclose_default on a later loop finds no limiter of that
            # loop, and this one's reload thread would outlive the test
            await aio.aclose_default()
        return lim

    first = asyncio.run(use())
    second = asyncio.run(use(close=True))  # the first loop is closed: its limiter is retired
    assert second is not first
    # both stopped reloading: no scheduler thread left to run on in later tests
    assert first.registry._scheduler is None and second.registry._scheduler is None


async def test_a_second_running_loop_is_told_to_build_its_own(sqlite_limits: None) -> None:
    ready, done = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    async def other_loop() -> None:
        try:
            await aio.try_acquire("/m")
            ready.set()
            while not done.is_set():
                await asyncio.sleep(0.01)
            await aio.aclose_default()
        except BaseException as e:
            errors.append(e)
            ready.set()

    thread = threading.Thread(target=asyncio.run, args=(other_loop(),))
    thread.start()
    try:
        assert await asyncio.to_thread(ready.wait, 10)
        with pytest.raises(RuntimeError, match="AsyncGatewayLimiter for each loop"):
            await aio.try_acquire("/m")
    finally:
        done.set()
        await asyncio.to_thread(thread.join, 10)
    assert errors == []


async def test_module_level_coroutines_pass_the_caller_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = f"sqlite:///{tmp_path / 'limits.db'}"
    engine = make_engine(db)
    upgrade(engine)
    upsert_conf(engine, "/per-caller", rate_limit=1, cache=0.0, status=1, per_caller=1)
    engine.dispose()
    monkeypatch.setenv("GATEWAY_LIMITER_DATABASE_URL", db)
    monkeypatch.setenv("GATEWAY_LIMITER_REDIS_URL", "memory://")
    try:
        assert await aio.try_acquire("/per-caller", key="a")
        assert not await aio.try_acquire("/per-caller", key="a")
        assert await aio.try_acquire("/per-caller", timeout=0, key="b")
        assert await aio.acquire("/per-caller", key="c") == 0.0
        assert 0.9 <= await aio.acquire("/per-caller", key="c") <= 1.01
    finally:
        await aio.aclose_default()


async def test_module_level_decide_answers_with_the_decision(sqlite_limits: None) -> None:
    try:
        decisions = [await aio.decide("/m") for _ in range(6)]
        assert [d.allowed for d in decisions] == [True] * 5 + [False]
        assert decisions[0].headers()["X-RateLimit-Remaining"] == "4"
        assert decisions[-1].reason == "limited"
    finally:
        await aio.aclose_default()
