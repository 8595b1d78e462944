"""``gateway_limiter.admin``: create the tables, set a limit, the switch, from Python,
as a running limiter then reads them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gateway_limiter import GatewayLimiter, admin
from gateway_limiter.config.migrate import current_revision, head_revision
from gateway_limiter.config.table import find_rows, make_engine, read_switch

ADMIN = Path(admin.__file__)


@pytest.fixture
def db_url(any_db: str) -> str:
    admin.upgrade(any_db)
    return any_db


def test_upgrade_creates_a_sqlite_file_at_the_newest_revision(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"
    admin.upgrade(url)
    admin.upgrade(url)  # again: nothing to do

    assert (tmp_path / "new.db").is_file()
    engine = make_engine(url)
    assert current_revision(engine) == head_revision(engine)
    engine.dispose()


def test_set_limit_creates_then_updates_the_row_of_one_period_and_scope(db_url: str) -> None:
    first = admin.set_limit(db_url, "/m", 10, cache=0.5)
    again = admin.set_limit(db_url, "/m", 20)  # same period and scope: the same row
    per_caller = admin.set_limit(db_url, "/m", 2, per_caller=True, period_seconds=60)

    assert again == first and per_caller != first
    engine = make_engine(db_url)
    rows = {r.config_id: r for r in find_rows(engine, "/m")}
    engine.dispose()
    assert rows[first].rate_limit == 20 and rows[first].cache is None  # every column written
    assert rows[first].status == 1 and rows[first].period_seconds == 1
    assert (rows[per_caller].per_caller, rows[per_caller].period_seconds) == (1, 60)


def test_set_limit_stores_a_calendar_quota_beside_the_rate_and_refuses_bad_ones(
    db_url: str,
) -> None:
    rate = admin.set_limit(db_url, "/q", 20)
    daily = admin.set_limit(db_url, "/q", 50_000, quota_period="day", time_zone="Asia/Shanghai")
    again = admin.set_limit(db_url, "/q", 40_000, quota_period="day", quota_renews="02:00")
    assert daily == again and daily != rate
    with pytest.raises(ValueError, match="quotaRenews '31 00:00' names the 31st"):
        admin.set_limit(db_url, "/q", 9, quota_period="month", quota_renews="31 00:00")
    with pytest.raises(ValueError, match="timeZone 'Peking'"):
        admin.set_limit(db_url, "/q", 9, quota_period="week", time_zone="Peking")
    engine = make_engine(db_url)
    rows = {r.config_id: r for r in find_rows(engine, "/q")}
    engine.dispose()
    assert set(rows) == {rate, daily}
    assert (rows[daily].rate_limit, rows[daily].quota_period, rows[daily].quota_renews) == (
        40_000,
        "day",
        "02:00",
    )
    assert rows[daily].time_zone is None  # every column written: back to the default
    assert rows[rate].quota_period is None


def test_a_limiter_enforces_what_admin_stored(db_url: str) -> None:
    admin.set_limit(db_url, "/m", 3, cache=0.0)
    admin.set_limit(db_url, "/off", 1, cache=0.0, enabled=False)
    with GatewayLimiter(database_url=db_url, redis_url="memory://", reload_interval=60) as lim:
        assert [lim.try_acquire("/m") for _ in range(4)] == [True, True, True, False]
        assert all(lim.try_acquire("/off") for _ in range(3))  # stored, not enforced

        admin.set_switch(db_url, False)
        lim.reload()
        assert lim.try_acquire("/m")  # switch off: every call admitted


def test_set_switch_stores_on_off_and_back_to_the_setting(db_url: str) -> None:
    engine = make_engine(db_url)
    seen = []
    for value in (False, True, None):
        admin.set_switch(db_url, value)
        seen.append(read_switch(engine))
    engine.dispose()
    assert seen == [False, True, None]


@pytest.mark.parametrize(
    ("columns", "why"),
    [
        ({"rate": -1}, "rateLimit -1 is negative"),
        ({"rate": 5, "cache": -1.0}, "cache -1.0 is negative"),
        ({"rate": 5, "algorithm": "warm_up"}, "warmupPeriod"),
        ({"rate": 5, "algorithm": "leaky"}, "leaky"),
        ({"rate": 5, "enabled": False, "algorithm": "leaky"}, "leaky"),  # checked even off
    ],
)
def test_a_limit_the_reload_would_skip_is_refused_and_not_written(
    db_url: str, columns: dict[str, object], why: str
) -> None:
    with pytest.raises(ValueError, match=why) as raised:
        admin.set_limit(db_url, "/bad", **columns)  # type: ignore[arg-type]
    assert "'/bad'" in str(raised.value)
    engine = make_engine(db_url)
    assert find_rows(engine, "/bad") == []
    engine.dispose()


def test_a_url_with_a_control_character_is_refused_and_not_written(db_url: str) -> None:
    with pytest.raises(ValueError, match=r"control character '\\n'"):
        admin.set_limit(db_url, "/bad\nx", rate=1)
    engine = make_engine(db_url)
    assert find_rows(engine, "/bad\nx") == []
    engine.dispose()


def test_admin_imports_no_database_library_until_a_function_is_called() -> None:
    tree = ast.parse(ADMIN.read_text(encoding="utf-8"))
    top = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    modules = {n.module for n in top if isinstance(n, ast.ImportFrom)}
    modules |= {a.name for n in top if isinstance(n, ast.Import) for a in n.names}
    assert modules <= {"__future__", "typing"}, modules
