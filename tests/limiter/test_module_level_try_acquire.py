"""``gateway_limiter.try_acquire``: one process-wide limiter, built once from settings."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

import gateway_limiter
from gateway_limiter import GatewayLimiter
from tests.support.limiting import write_row
from tests.support.services import RedisServer


@pytest.fixture
def settings_file(
    migrated_db: tuple[str, Engine],
    redis_server: RedisServer,
    key_prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Path]:
    db_url, engine = migrated_db
    # 10 saved up, refilled at 1/s: a loaded host that stalls between the calls counted
    # here refills nothing that would change what is counted
    write_row(engine, "/m", rateLimit=1, maxPermits=10, cache=0.0, status=1)
    path = tmp_path / "settings.toml"
    path.write_text(
        f'database_url = "{db_url}"\nredis_url = "{redis_server.url}"\n'
        f'key_prefix = "{key_prefix}"\nreload_interval = 60\n'
    )
    monkeypatch.setenv("GATEWAY_LIMITER_SETTINGS", str(path))
    monkeypatch.setattr(gateway_limiter, "_default", None)
    yield path
    if gateway_limiter._default is not None:
        gateway_limiter._default.close()


def test_concurrent_first_calls_build_exactly_one_limiter_from_settings(
    settings_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[GatewayLimiter] = []
    original = GatewayLimiter.start

    def counting_start(self: GatewayLimiter) -> object:
        built.append(self)
        return original(self)

    monkeypatch.setattr(GatewayLimiter, "start", counting_start)
    barrier = threading.Barrier(16)
    results: list[bool] = []

    def call() -> None:
        barrier.wait()
        results.append(gateway_limiter.try_acquire("/m"))

    threads = [threading.Thread(target=call) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(built) == 1
    assert gateway_limiter.default_limiter() is built[0]
    assert built[0].settings.redis_url.startswith("redis://")  # from the file, not defaults
    assert sorted(results) == [False] * 6 + [True] * 10  # the row's rate, shared


def test_module_level_acquire_waits_for_its_permit(settings_file: Path) -> None:
    for _ in range(10):
        assert gateway_limiter.acquire("/m") == 0.0
    waited = gateway_limiter.acquire("/m")
    assert 0.5 < waited <= 1.0 + 0.01  # the next permit, a second after the first call


def test_module_level_functions_pass_the_caller_key(
    settings_file: Path, migrated_db: tuple[str, Engine]
) -> None:
    write_row(migrated_db[1], "/per-caller", rateLimit=1, cache=0.0, perCaller=1)
    assert gateway_limiter.try_acquire("/per-caller", key="a")
    assert not gateway_limiter.try_acquire("/per-caller", key="a")
    assert gateway_limiter.try_acquire("/per-caller", timeout=0, key="b")
    assert gateway_limiter.acquire("/per-caller", key="c") == 0.0
    assert 0.9 <= gateway_limiter.acquire("/per-caller", key="c") <= 1.01


def test_module_level_decide_answers_with_the_decision(settings_file: Path) -> None:
    decisions = [gateway_limiter.decide("/m") for _ in range(11)]
    assert [d.reason for d in decisions[:10]] == ["admitted"] * 10
    assert decisions[0].headers() == {"X-RateLimit-Limit": "1", "X-RateLimit-Remaining": "9"}
    assert decisions[-1].reason == "limited"  # cache 0: no wait allowed
    assert gateway_limiter.decide("/nowhere") == gateway_limiter.Decision(True, "not_configured")


def test_module_level_slot_and_pushback_act_on_the_process_wide_limiter(
    settings_file: Path, migrated_db: tuple[str, Engine]
) -> None:
    # written once in aio.py and generated into limiter.py: the package offers those
    from gateway_limiter import limiter

    assert gateway_limiter.slot is limiter.slot and gateway_limiter.decide is limiter.decide
    write_row(migrated_db[1], "/slotted", rateLimit=100, cache=0.0, maxConcurrent=1)
    with gateway_limiter.slot("/slotted") as held:
        assert held.allowed and held.in_flight == 1
        assert gateway_limiter.default_limiter().in_flight("/slotted") == 1
        with pytest.raises(gateway_limiter.Refused), gateway_limiter.slot("/slotted", 0):
            pass  # the one slot is held
    assert gateway_limiter.default_limiter().in_flight("/slotted") == 0
    gateway_limiter.pushback("/m", retry_after=30.0)
    refused = gateway_limiter.decide("/m")
    assert not refused.allowed and refused.retry_after is not None
    assert refused.retry_after > 29.0
