"""The ``gateway_limiter`` logger: one line per event, passwords masked, and events that
can repeat without bound (shadow refusals, a flapping Redis) logged at a bounded rate
with a count of what was held back."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.backends.base import BackendError
from gateway_limiter.core import failure, outcomes
from gateway_limiter.core.failure import Breaker
from gateway_limiter.observe.logs import LOGGER_NAME, SHADOW_REPORT_SECONDS, Throttle, one_line
from tests.support.limiting import limiter, write_row
from tests.support.services import RedisServer


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class ManualClock(Clock):
    """A limiter's ``Clock`` the test moves by hand (sleeps move it)."""

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    async def sleep_async(self, seconds: float) -> None:
        self.now += seconds


def messages(caplog: pytest.LogCaptureFixture, part: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if part in r.getMessage()]


def test_throttle_lets_one_line_per_key_through_and_counts_the_rest() -> None:
    clock = Clock()
    throttle = Throttle(10.0, clock)
    assert throttle.ready("/a") == 0
    assert [throttle.ready("/a") for _ in range(3)] == [None] * 3
    assert throttle.ready("/b") == 0  # keys are independent
    clock.now += 9.9
    assert throttle.ready("/a") is None
    clock.now += 0.1
    assert throttle.ready("/a") == 4  # the four held back since the last line
    assert throttle.ready("/a") is None


def test_one_line_masks_passwords_and_folds_newlines() -> None:
    text = "Error connecting to redis://user:s3cret@10.0.0.1:6379/0.\n  Connection refused"
    assert one_line(text) == (
        "Error connecting to redis://user:***@10.0.0.1:6379/0. Connection refused"
    )


def test_a_flapping_redis_is_reported_once_per_interval_with_a_count(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a second: the three outages below fall well within it, even on a loaded host
    monkeypatch.setattr(failure, "OUTAGE_REPORT_SECONDS", 1.0)
    caplog.set_level(logging.DEBUG, logger=LOGGER_NAME)
    clock = ManualClock()
    breaker = Breaker(0.01, clock)
    error = BackendError("ConnectionError: redis://:s3cret@cache:6379\nsecond line")
    for _ in range(3):  # three outages in quick succession
        breaker.failed(error)
        breaker.succeeded()
    down = messages(caplog, "Redis unreachable")
    assert down == [
        "Redis unreachable (ConnectionError: redis://:***@cache:6379 second line); "
        "deciding by on_backend_error"
    ]
    assert len(messages(caplog, "reachable again")) == 1  # only for the outage reported
    clock.now += 1.05  # the breaker's clock: its reports follow it
    breaker.failed(error)
    assert messages(caplog, "Redis unreachable")[-1].endswith("(2 more since the last report)")
    assert all("\n" not in r.getMessage() for r in caplog.records)


@pytest.fixture
def report_clock() -> Clock:
    """The clock the shadow refusals' reports are throttled on: moved by the test."""
    return Clock()


@pytest.fixture
def shadow_limiter(
    migrated_db: tuple[str, Engine],
    redis_server: RedisServer,
    key_prefix: str,
    report_clock: Clock,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[GatewayLimiter]:
    # the ten refusals below fall within one report's seconds however loaded the host
    monkeypatch.setattr(outcomes, "Throttle", lambda seconds: Throttle(seconds, report_clock))
    db, engine = migrated_db
    write_row(engine, "/trial", rateLimit=1, cache=0.0, status=1, shadow=1)
    lim = limiter(db, redis_server.url, key_prefix)
    yield lim
    lim.close()


def test_shadow_refusals_are_logged_at_a_bounded_rate(
    shadow_limiter: GatewayLimiter, report_clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    reasons = [shadow_limiter.decide("/trial").reason for _ in range(11)]
    assert reasons == ["admitted"] + ["shadow"] * 10
    (line,) = messages(caplog, "would have refused")
    assert line.startswith("shadow rule /trial (1/s, configId 1) would have refused a call")

    def refused() -> None:  # a permit may come back meanwhile on a slow host
        while shadow_limiter.decide("/trial").reason != "shadow":
            pass

    report_clock.now += SHADOW_REPORT_SECONDS - 0.05
    refused()  # not yet: held back
    assert len(messages(caplog, "would have refused")) == 1
    report_clock.now += 0.1
    refused()  # the report's seconds have passed: logged
    lines = messages(caplog, "would have refused")
    assert len(lines) == 2
    assert lines[-1].endswith("(10 more since the last report)")
