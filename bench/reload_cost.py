#!/usr/bin/env python
"""What one reload of the limits table costs the database, on a real MariaDB.

Run from the checkout, with the venv's Python (about 10 s)::

    python bench/reload_cost.py                    # 1,000 rows, MariaDB on 127.0.0.1:3306
    python bench/reload_cost.py --rows 10000 --mysql-url mysql+pymysql://root@db:3306/

Every process reads the whole table every ``reload_interval`` seconds (10 by default):
a fleet of P processes sends P / 10 reloads a second. This creates a database of its
own (dropped on exit), migrates it, fills ``t_ratelimite_conf`` with ``--rows`` enabled
rows, and then, ``--repeats`` times:

- **reload, wall**: ``Registry.reload()`` as the limiter runs it (read the rows, build
  the rules, read the switch), timed in this process: what one process spends;
- **database time**: the SQL statements that reload sent (captured from SQLAlchemy),
  replayed on one connection with MariaDB's ``SET profiling = 1``; ``SHOW PROFILES``
  gives the server's own duration of each: what the database spends per reload.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pymysql
from sqlalchemy import event, text
from sqlalchemy.engine import make_url

# Run as a script from anywhere: the checkout's package wins over any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness.args import description, positive_int
from bench.harness.report import load_average, table
from gateway_limiter.config.migrate import upgrade
from gateway_limiter.config.reload import Registry
from gateway_limiter.config.settings import Settings
from gateway_limiter.config.table import make_engine


@contextmanager
def scratch_database(server_url: str) -> Iterator[str]:
    """A new database on the server at ``server_url``; its SQLAlchemy URL. Dropped on exit."""
    url = make_url(server_url)
    conn = pymysql.connect(
        host=url.host or "127.0.0.1",
        port=url.port or 3306,
        user=url.username or "root",
        password=url.password or "",
        autocommit=True,
        connect_timeout=5,
    )
    name = f"gwl_bench_{uuid.uuid4().hex[:10]}"
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{name}`")
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        conn.close()


def fill(database_url: str, rows: int) -> None:
    """``rows`` enabled limit rows, one interface each, in one multi-row INSERT per 500."""
    engine = make_engine(database_url)
    try:
        upgrade(engine)
        with engine.begin() as conn:
            for start in range(0, rows, 500):
                values = [
                    {"u": f"/bench/reload/{i}", "r": 100 + i}
                    for i in range(start, min(rows, start + 500))
                ]
                conn.execute(
                    text(
                        "insert into t_ratelimite_conf (interfaceUrl, rateLimit, cache, status)"
                        " values (:u, :r, 0.5, 1)"
                    ),
                    values,
                )
    finally:
        engine.dispose()


def captured_statements(registry: Registry) -> list[str]:
    """The SQL statements one reload sends, with their parameters inlined."""
    seen: list[str] = []

    def record(_conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        seen.append(cursor.mogrify(statement, parameters) if parameters else statement)

    event.listen(registry.engine, "before_cursor_execute", record)
    try:
        registry.reload()
    finally:
        event.remove(registry.engine, "before_cursor_execute", record)
    return seen


def server_seconds(database_url: str, statements: list[str]) -> float:
    """The server's own time for ``statements`` (SHOW PROFILES), on one connection."""
    url = make_url(database_url)
    conn = pymysql.connect(
        host=url.host or "127.0.0.1",
        port=url.port or 3306,
        user=url.username or "root",
        password=url.password or "",
        database=url.database,
        autocommit=True,
    )
    try:
        with conn.cursor() as cur:
            cur.execute("SET profiling = 1")
            cur.execute("SET profiling_history_size = 100")
            for statement in statements:
                cur.execute(statement)
                cur.fetchall()
            cur.execute("SHOW PROFILES")
            profiles = cur.fetchall()
    finally:
        conn.close()
    wanted = profiles[-len(statements) :]
    return sum(float(p[1]) for p in wanted)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--rows", type=positive_int, default=1000, help="limit rows in the table")
    parser.add_argument("--repeats", type=positive_int, default=15, help="reloads measured")
    parser.add_argument(
        "--mysql-url",
        default="mysql+pymysql://root@127.0.0.1:3306/",
        help="the MariaDB/MySQL server (a scratch database is made there and dropped)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure and print the table."""
    args = parse_args(argv)
    if args.rows < 1 or args.repeats < 1:
        raise SystemExit("--rows and --repeats must be >= 1")
    began = time.monotonic()
    with scratch_database(args.mysql_url) as database_url:
        fill(database_url, args.rows)
        registry = Registry(Settings(database_url=database_url, reload_interval=3600))
        try:
            registry.reload()  # connected, table inspected once
            statements = captured_statements(registry)
            wall, server = [], []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                summary = registry.reload()
                wall.append(time.perf_counter() - t0)
                server.append(server_seconds(database_url, statements))
            rules = len(registry.snapshot.rules)
            version = registry.engine.dialect.server_version_info
        finally:
            registry.close()
    print(f"date:     {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"command:  {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(f"server:   MySQL/MariaDB {'.'.join(str(v) for v in version or ())} at {args.mysql_url}")
    print(f"load:     {load_average()} (1/5/15-min load average at the end)")
    print(f"table:    {args.rows:,} enabled rows; the reload built {rules:,} rules ({summary})")
    print(f"sent:     {len(statements)} statements per reload:")
    for statement in statements:
        print(f"          {' '.join(statement.split())[:100]}")
    print()
    print(f"1. One reload of {args.rows:,} rows ({args.repeats} repeats)")
    ms = [x * 1000 for x in wall]
    db = [x * 1000 for x in server]
    print(
        table(
            ["what", "median ms", "lowest ms", "highest ms"],
            [
                [
                    "reload, wall (this process)",
                    *(f"{f(ms):.2f}" for f in (statistics.median, min, max)),
                ],
                [
                    "database time (SHOW PROFILES)",
                    *(f"{f(db):.2f}" for f in (statistics.median, min, max)),
                ],
            ],
        )
    )
    print(
        "database time: the server's duration of the statements one reload sends, "
        "replayed with profiling on."
    )
    print(f"\n(run took {time.monotonic() - began:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
