"""Any arguments to the command line: exit 0, 1 or 2 with one line on stderr, never a
traceback; and a command that does not succeed writes nothing (both tables unchanged).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, select

from gateway_limiter.cli import main
from gateway_limiter.config.table import LimiterSwitch, RateLimitConf, upsert_conf

ROWS = {"/ibe/a": 5, "/ibe/b": 0}
nasty = st.text(
    alphabet=st.one_of(st.sampled_from("'\";{}% \n\t-é中"), st.characters(codec="utf-8")),
    max_size=140,
)
numbers = st.one_of(
    st.integers(-5, 2**32).map(str),
    st.floats().map(str),
    st.sampled_from(["0", "1", "0.5", "9.99", "10", "1e3", "0x10", " 5", "5 ", "", "none", "NaN"]),
    nasty,
)
urls = st.one_of(st.sampled_from([*ROWS, "/new"]), nasty)


def flag(name: str, values: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
    return st.one_of(st.just([]), values.map(lambda v: [name, v]), st.just([name]))


conf_set = st.tuples(
    st.just(["conf", "set"]),
    st.lists(urls, min_size=0, max_size=2),
    flag("--rate", numbers),
    flag("--cache", numbers),
    flag("--channel", nasty),
    flag("--interface-no", nasty),
    flag("--algorithm", st.one_of(st.sampled_from(["token_bucket", "warm_up"]), nasty)),
    flag("--max-permits", numbers),
    flag("--warmup", numbers),
    st.sampled_from([[], ["--enable"], ["--disable"], ["--enable", "--disable"]]),
).map(lambda parts: [a for part in parts for a in part])
other = st.one_of(
    st.tuples(st.sampled_from(["enable", "disable"]), st.lists(urls, max_size=2)).map(
        lambda p: ["conf", p[0], *p[1]]
    ),
    st.lists(st.one_of(st.sampled_from(["on", "off", "status", "default"]), nasty), max_size=2).map(
        lambda rest: ["switch", *rest]
    ),
    st.lists(urls, max_size=2).map(lambda rest: ["status", *rest]),
    st.just(["conf", "list"]),
    # anything at all (but the demo, which runs for seconds)
    st.lists(nasty, max_size=3).filter(lambda argv: "demo" not in argv),
    st.lists(nasty.filter(lambda s: not s.strip().isdigit()), max_size=2).map(
        lambda rest: ["demo", "--seconds", *rest]
    ),
)


def watches(argv: list[str]) -> bool:
    """``argv`` holds ``--watch`` or an abbreviation argparse takes for it (``--w``)."""
    return any(a.startswith("--w") and "--watch".startswith(a) for a in argv)


#: No settings.toml or GATEWAY_LIMITER_* from the developer's machine leak in.
pytestmark = pytest.mark.usefixtures("no_local_settings")


@pytest.fixture
def db(migrated_any_db: tuple[str, Engine]) -> Iterator[tuple[str, Engine]]:
    url, engine = migrated_any_db
    for u, rate in ROWS.items():
        upsert_conf(engine, u, rate_limit=rate, cache=0.5, status=1)
    yield url, engine


def tables(engine: Engine) -> tuple[list[Any], list[Any]]:
    """Everything both tables hold."""
    conf, switch = RateLimitConf.__table__, LimiterSwitch.__table__
    with engine.connect() as conn:
        return (
            [tuple(r) for r in conn.execute(select(conf).order_by(conf.c.configId))],
            [tuple(r) for r in conn.execute(select(switch))],
        )


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(argv=st.one_of(conf_set, other))
def test_any_arguments_exit_0_1_or_2_and_a_failure_writes_nothing(
    db: tuple[str, Engine], capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    url, engine = db
    assume(not watches(argv))  # `status --watch` refreshes until Ctrl-C, as it should
    before = tables(engine)
    capsys.readouterr()
    code = main(["--database-url", url, "--redis-url", "memory://", *argv])
    out, err = capsys.readouterr()
    assert code in (0, 1, 2), (argv, code, err)
    assert "Traceback" not in err
    if code != 0:
        (line,) = err.splitlines()  # one line, even when an argument holds a newline
        assert line.startswith("gateway-limiter") and "error: " in line, err
        assert tables(engine) == before, (argv, err)
    if code == 0 and argv[:2] == ["conf", "set"]:
        assert "created configId" in out or "updated configId" in out
    if argv[:1] == ["demo"]:
        assert code == 2  # only bad --seconds are generated: the demo never runs here


def test_a_misplaced_url_is_refused_on_one_line_with_its_password_masked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # argparse quoted unrecognised arguments raw: a URL typed in the wrong place showed
    # its password, and an argument with a newline broke the one-line error.
    code = main(["conf", "list", "mysql+pymysql://gw:s3cret@db/limits", "a\nb"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "s3cret" not in err
    assert "mysql+pymysql://gw:***@db/limits" in err
