"""``leaseMs`` from the table to the limiter: the reload's checks (a skipped row, or a
lease ignored where it cannot apply), ``conf set``, ``conf list``, ``status``, and the
checks the console shares with ``conf set`` (``config/edits.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from gateway_limiter.cli.arguments import MAX_LEASE_MS as CLI_MAX_LEASE_MS
from gateway_limiter.config.edits import FieldError, check_values
from gateway_limiter.config.rules import MAX_LEASE_MS, build_rules
from gateway_limiter.config.table import find_rows, make_engine, read_rows
from tests.support.commandline import cli, settings_file
from tests.support.limiting import write_row
from tests.support.services import RedisServer

pytestmark = pytest.mark.usefixtures("no_local_settings")


def test_the_reload_reads_lease_ms_and_ignores_one_out_of_range_keeping_the_limit(
    migrated_any_db: tuple[str, Engine],
) -> None:
    _db, engine = migrated_any_db
    write_row(engine, "/hot", rateLimit=50_000, cache=0.1, leaseMs=20)
    write_row(engine, "/zero", rateLimit=10, cache=0.1, leaseMs=0)
    negative = write_row(engine, "/negative", rateLimit=10, cache=0.1, leaseMs=-1)
    absurd = write_row(engine, "/absurd", rateLimit=10, cache=0.1, leaseMs=MAX_LEASE_MS + 1)
    write_row(engine, "/off", rateLimit=10, cache=0.1, leaseMs=-5, status=0)
    ruleset = build_rules(read_rows(engine), 0.5)
    assert ruleset.rules["/hot"].lease_ms == 20
    assert ruleset.rules["/zero"].lease_ms == 0  # 0: no lease, as NULL
    # a bad leaseMs (an optional performance setting) never unlimits the interface
    for url in ("/negative", "/absurd"):
        assert (ruleset.rules[url].rate, ruleset.rules[url].lease_ms) == (10, 0)
    assert ruleset.skipped == ()
    assert ruleset.warnings == (  # a disabled row's is not said: it does not apply
        f"leaseMs of configId {negative} ignored on '/negative': leaseMs -1 is not from 0 "
        "to 60000 ms (the row applies without a lease)",
        f"leaseMs of configId {absurd} ignored on '/absurd': leaseMs 60001 is not from 0 "
        "to 60000 ms (the row applies without a lease)",
    )


@pytest.mark.parametrize(
    ("columns", "why"),
    [
        ({"algorithm": "warm_up", "warmupPeriod": 2.0}, "warm_up is not token_bucket"),
        ({"algorithm": "fixed_window"}, "fixed_window is not token_bucket"),
        ({"perCaller": 1}, "the row is perCaller"),
        ({"shadow": 1}, "the row is shadow"),
    ],
)
def test_a_lease_where_it_cannot_apply_is_ignored_with_a_warning_naming_the_row(
    migrated_any_db: tuple[str, Engine], columns: dict[str, Any], why: str
) -> None:
    _db, engine = migrated_any_db
    row = write_row(engine, "/x", rateLimit=10, cache=0.1, leaseMs=50, **columns)
    ruleset = build_rules(read_rows(engine), 0.5)
    rules = [*ruleset.rules.values(), *ruleset.named.values()]
    assert [r.lease_ms for r in rules] == [0]  # the row applies, without a lease
    assert ruleset.warnings == (
        f"leaseMs of configId {row} ignored on '/x': {why} (a lease needs one shared, "
        "enforced token_bucket row)",
    )


def test_a_lease_on_an_interface_of_several_limits_or_under_a_channel_cap_is_ignored(
    migrated_any_db: tuple[str, Engine],
) -> None:
    _db, engine = migrated_any_db
    first = write_row(engine, "/two", rateLimit=10, cache=0.1, leaseMs=50)
    write_row(engine, "/two", add=True, rateLimit=100, periodSeconds=60)
    capped = write_row(engine, "/capped", rateLimit=10, leaseMs=50, channelType="IBE")
    write_row(engine, "*", rateLimit=15, channelType="IBE")
    ruleset = build_rules(read_rows(engine), 0.5)
    assert ruleset.rules["/two"].lease_ms == 0 and ruleset.rules["/capped"].lease_ms == 0
    assert sorted(ruleset.warnings) == sorted(
        f"leaseMs of configId {row} ignored on {url!r}: the interface has several limits "
        "(or a channel cap) (a lease needs one shared, enforced token_bucket row)"
        for row, url in ((first, "/two"), (capped, "/capped"))
    )


def test_the_console_and_conf_set_share_the_check_of_lease_ms() -> None:
    assert check_values({"leaseMs": 20}) == {"lease_ms": 20}
    assert check_values({"leaseMs": 0}) == {"lease_ms": None}  # 0 clears it
    assert check_values({"leaseMs": None}) == {"lease_ms": None}
    for bad in (-1, MAX_LEASE_MS + 1, 2.5, "20", True):
        with pytest.raises(FieldError, match="leaseMs"):
            check_values({"leaseMs": bad})
    assert CLI_MAX_LEASE_MS == MAX_LEASE_MS


def test_conf_set_writes_and_clears_lease_ms_and_conf_list_shows_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path / 'limits.db'}"
    assert cli(capsys, "--database-url", db, "db", "upgrade").code == 0
    ran = cli(capsys, "--database-url", db, "conf", "set", "/x", "--rate", "5", "--enable")
    assert ran.code == 0, ran.err
    assert "leaseMs" not in cli(capsys, "--database-url", db, "conf", "list").out
    ran = cli(capsys, "--database-url", db, "conf", "set", "/x", "--lease-ms", "20")
    assert ran.code == 0, ran.err
    assert "leaseMs NULL -> 20" in ran.out
    listed = cli(capsys, "--database-url", db, "conf", "list")
    header = listed.out.splitlines()[1].split()
    assert header[-2:] == ["leaseMs", "effect"]
    row = next(line for line in listed.out.splitlines() if " /x " in line).split()
    assert row[header.index("leaseMs") + 1] == "20"  # the date takes two words
    for cleared in ("0", "none"):
        cli(capsys, "--database-url", db, "conf", "set", "/x", "--lease-ms", "30")
        ran = cli(capsys, "--database-url", db, "conf", "set", "/x", "--lease-ms", cleared)
        assert ran.code == 0, ran.err
        assert "leaseMs 30 -> NULL" in ran.out
    for bad in ("-2", "60001", "1.5"):
        ran = cli(capsys, "--database-url", db, "conf", "set", "/x", "--lease-ms", bad)
        assert ran.code == 2
        assert repr(bad) in ran.err and "--lease-ms" in ran.err
    engine = make_engine(db)
    try:
        assert [r.lease_ms for r in find_rows(engine, "/x")] == [None]
    finally:
        engine.dispose()


def test_status_says_a_row_is_leased(
    capsys: pytest.CaptureFixture[str],
    migrated_any_db: tuple[str, Engine],
    redis_server: RedisServer,
    key_prefix: str,
    tmp_path: Path,
) -> None:
    db, engine = migrated_any_db
    write_row(engine, "/hot", rateLimit=100, cache=0.1, leaseMs=40)
    write_row(engine, "/plain", rateLimit=100, cache=0.1)
    write_row(engine, "/minute", rateLimit=100_000, periodSeconds=60, cache=0.1)
    settings = settings_file(tmp_path, db, redis_server.url, key_prefix)
    ran = cli(capsys, "--settings", str(settings), "status")
    assert ran.code == 0, ran.err
    lines = ran.out.splitlines()
    assert "; rate leases of 40 ms" in next(line for line in lines if line.startswith("/hot "))
    assert "lease" not in next(line for line in lines if line.startswith("/plain "))
    # numbers as a person writes them, never 1e+05: rate, capacity, effective rate
    minute = next(line for line in lines if line.startswith("/minute ")).split()
    assert (minute[2], minute[4]) == ("100,000/60s", "100,000")
    assert minute[8] == "100,000/60s"  # the effective rate: no pushback, the rate
    assert "e+" not in " ".join(minute)


def test_conf_set_and_enable_say_on_stderr_that_the_reload_ignores_the_lease(
    capsys: pytest.CaptureFixture[str], migrated_db: tuple[str, Engine]
) -> None:
    db, engine = migrated_db
    # 500/s: a lease of 20 ms holds 10 permits (one permit a lease has its own warning)
    ran = cli(capsys, "--database-url", db, "conf", "set", "/x", "--rate", "500")
    assert ran.code == 0, ran.err
    (row,) = find_rows(engine, "/x")
    ignored = (
        f"leaseMs of configId {row.config_id} ignored on '/x': sliding_window is not "
        "token_bucket (a lease needs one shared, enforced token_bucket row)"
    )
    ran = cli(
        capsys, "--database-url", db, "conf", "set", "/x", "--algorithm", "sliding_window",
        "--lease-ms", "20",
    )  # fmt: skip
    assert ran.code == 0, ran.err
    assert f"warning: once enabled, {ignored}" in " ".join(ran.err.split())
    assert "warning" not in ran.out
    ran = cli(capsys, "--database-url", db, "conf", "enable", "/x")
    assert ran.code == 0, ran.err
    assert f"warning: {ignored}" in " ".join(ran.err.split())
    assert "once enabled" not in ran.err
    ran = cli(capsys, "--database-url", db, "conf", "set", "/x", "--cache", "0.2")
    assert ran.code == 0 and "warning" in ran.err  # every write of the row says it again
    # a lease that applies: nothing to say
    ran = cli(capsys, "--database-url", db, "conf", "set", "/x", "--algorithm", "token_bucket")
    assert ran.code == 0, ran.err
    assert "warning" not in ran.err
    # a row of another period beside the leased one: its lease will be ignored
    ran = cli(capsys, "--database-url", db, "conf", "set", "/x", "--rate", "100", "--period", "60")
    assert ran.code == 0, ran.err
    several = (
        f"leaseMs of configId {row.config_id} ignored on '/x': the interface has several "
        "limits (or a channel cap)"
    )
    assert f"warning: once enabled, {several}" in " ".join(ran.err.split())
    ran = cli(capsys, "--database-url", db, "conf", "enable", "/x", "--period", "60")
    assert ran.code == 0, ran.err
    assert f"warning: {several}" in " ".join(ran.err.split())
    assert "once enabled" not in ran.err


def test_conf_set_warns_when_a_lease_would_hold_one_permit(
    capsys: pytest.CaptureFixture[str], migrated_db: tuple[str, Engine]
) -> None:
    """n = max(1, floor(R x L / 1000)) = 1 saves no round trip: said on stderr, naming the
    rate, leaseMs and n, with the least leaseMs for 2 permits; the row is written."""
    db, engine = migrated_db

    def conf_set(url: str, *argv: str) -> str:
        ran = cli(capsys, "--database-url", db, "conf", "set", url, *argv)
        assert ran.code == 0, ran.err
        assert "warning" not in ran.out
        return " ".join(ran.err.split())

    said = conf_set("/x", "--rate", "10", "--lease-ms", "20")
    assert said == (
        "gateway-limiter: warning: leaseMs 20 at rate 10/s leases 1 permit at a time "
        "(n = max(1, floor(R x leaseMs / 1000)) = 1): every call still costs a round trip, "
        "so the lease saves none; give --lease-ms 200 or more for 2 permits a lease, or "
        "--lease-ms 0"
    ), said
    assert [r.lease_ms for r in find_rows(engine, "/x")] == [20]  # written all the same
    assert "leases 1 permit" in conf_set("/x", "--cache", "0.2")  # every write says it
    assert "leases 1 permit" in conf_set("/x", "--lease-ms", "199")  # 1.99 permits: 1
    assert conf_set("/x", "--lease-ms", "200") == ""  # 2 permits a lease: nothing to say
    assert "give --lease-ms 400 or more" in conf_set("/x", "--rate", "5")  # the rate changed
    assert conf_set("/x", "--lease-ms", "0") == ""  # no lease
    # a rate per period is R = rate / period a second
    said = conf_set("/y", "--rate", "30", "--period", "60", "--lease-ms", "2000")
    assert "leaseMs 2000 at rate 30 per 60 s (0.5/s) leases 1 permit" in said, said
    assert "give --lease-ms 4000 or more" in said, said
    assert conf_set("/y", "--period", "60", "--lease-ms", "4000") == ""
    # too slow for any leaseMs (at most 60,000) to hold 2 permits
    said = conf_set("/z", "--rate", "1", "--period", "3600", "--lease-ms", "1000")
    assert "no leaseMs up to 60000 makes 2 permits: clear it with --lease-ms 0" in said, said
    # a lease the reload ignores is not also said to hold 1 permit
    said = conf_set("/w", "--rate", "10", "--lease-ms", "20", "--algorithm", "sliding_window")
    assert "ignored on '/w'" in said and "leases 1 permit" not in said, said


def test_conf_set_of_a_channel_cap_names_each_leased_interface_it_makes_ignore_its_lease(
    capsys: pytest.CaptureFixture[str], migrated_db: tuple[str, Engine]
) -> None:
    db, engine = migrated_db
    leased = {
        url: write_row(engine, url, rateLimit=1000, leaseMs=20, channelType="IBE")
        for url in ("/pay", "/book")
    }
    write_row(engine, "/gds", rateLimit=1000, leaseMs=20, channelType="GDS")  # another channel
    write_row(engine, "/plain", rateLimit=1000, channelType="IBE")  # no lease: nothing to say
    ignored = [
        f"leaseMs of configId {row} ignored on {url!r}: the interface has several limits "
        "(or a channel cap) (a lease needs one shared, enforced token_bucket row)"
        for url, row in leased.items()
    ]
    ran = cli(capsys, "--database-url", db, "conf", "set", "*", "--channel", "IBE", "--rate", "5")
    assert ran.code == 0, ran.err
    said = " ".join(ran.err.split())
    for warning in ignored:
        assert f"warning: once enabled, {warning}" in said
    assert "'/gds'" not in said and "'/plain'" not in said
    ran = cli(capsys, "--database-url", db, "conf", "enable", "*", "--channel", "IBE")
    assert ran.code == 0, ran.err
    said = " ".join(ran.err.split())
    assert all(f"warning: {warning}" in said for warning in ignored)
    assert "once enabled" not in said
    # a lease on the cap itself is ignored on every interface it caps
    ran = cli(
        capsys, "--database-url", db, "conf", "set", "*", "--channel", "IBE", "--lease-ms", "9"
    )
    assert ran.code == 0, ran.err
    said = " ".join(ran.err.split())
    assert all(f"ignored on {url!r}" in said for url in ("/pay", "/book", "/plain"))
    # another channel's cap says nothing of IBE's interfaces or cap, only of its own
    ran = cli(capsys, "--database-url", db, "conf", "set", "*", "--channel", "GDS", "--rate", "5")
    assert ran.code == 0, ran.err
    said = " ".join(ran.err.split())
    assert "'/gds'" in said
    assert not any(f"ignored on {url!r}" in said for url in ("/pay", "/book", "/plain"))


def test_summaries_and_conf_list_name_the_concurrency_cap_and_the_rate_lease(
    capsys: pytest.CaptureFixture[str], migrated_db: tuple[str, Engine]
) -> None:
    db, _engine = migrated_db
    ran = cli(
        capsys, "--database-url", db, "conf", "set", "/hot", "--rate", "5000", "--lease-ms", "20",
        "--max-concurrent", "2", "--enable",
    )  # fmt: skip
    assert ran.code == 0, ran.err
    flat = " ".join(ran.out.split())
    assert "at most 2 in flight" in flat
    assert "rate leases of 20 ms: up to 100 permits per process at a time" in flat
    ran = cli(capsys, "--database-url", db, "conf", "enable", "/hot")
    assert ran.code == 0, ran.err
    flat = " ".join(ran.out.split())
    assert "callers wait up to 0.5 s, at most 2 in flight, rate leases of 20 ms: up to 100" in flat
    listed = " ".join(cli(capsys, "--database-url", db, "conf", "list").out.split())
    assert "wait <= 0.5 s, at most 2 in flight, rate leases of 20 ms: up to 100 permits" in listed
    # a tiny rate still leases one permit at a time: n = max(1, floor(R x L / 1000))
    cli(
        capsys, "--database-url", db, "conf", "set", "/hot", "--rate", "10", "--max-concurrent", "0"
    )
    ran = cli(capsys, "--database-url", db, "conf", "set", "/hot", "--cache", "0.2")
    flat = " ".join(ran.out.split())
    assert "rate leases of 20 ms: up to 1 permit per process at a time" in flat
    assert "in flight" not in flat
