"""Running the command line in-process, as the CLI tests do."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from sqlalchemy import Engine, text

from gateway_limiter.cli import main


class Ran(NamedTuple):
    """What one command did: its exit code and what it printed."""

    code: int
    out: str
    err: str


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> Ran:
    """``gateway-limiter *argv`` through ``main``, with what it printed."""
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return Ran(code, out, err)


def db_cli(capsys: pytest.CaptureFixture[str], db: str, *argv: str) -> Ran:
    """``cli`` on the database ``db`` (``--database-url``)."""
    return cli(capsys, "--database-url", db, *argv)


def conf_columns(engine: Engine, *columns: str) -> list[tuple[Any, ...]]:
    """``configId`` and ``columns`` of every row of the limits table, in configId order,
    read with plain SQL."""
    listed = ", ".join(("configId", *columns))
    with engine.connect() as conn:
        result = conn.execute(text(f"select {listed} from t_ratelimite_conf order by configId"))
        return [tuple(r) for r in result]


#: ``command(*argv)`` and ``refuses(argv, *says)``: the fixtures of tests/cli/conftest.py.
Command = Callable[..., Ran]
Refuses = Callable[..., None]


def settings_file(tmp_path: Path, database_url: str, redis_url: str, key_prefix: str) -> Path:
    """A settings.toml naming the test's database, Redis and key prefix, with patient
    Redis reads: on a loaded host a first call can take longer than the default 50 ms,
    and a decision the outage policy made would not be the one the test checks."""
    settings = tmp_path / "settings.toml"
    settings.write_text(
        f'database_url = "{database_url}"\nredis_url = "{redis_url}"\nkey_prefix = "{key_prefix}"\n'
        "redis_timeout = 2.0\nredis_timeout_ceiling = 2.0\n"
    )
    return settings
