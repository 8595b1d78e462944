"""Helpers for tests that run a real limiter on real services."""

from __future__ import annotations

from typing import Any, cast

import redis
from sqlalchemy import Engine, Table, text

from gateway_limiter import GatewayLimiter
from gateway_limiter.config.table import RateLimitConf

#: The limits table as a Core Table (the model's __table__ is typed as a FromClause).
CONF = cast(Table, RateLimitConf.__table__)


def evalsha_calls(client: redis.Redis) -> int:
    """How many EVALSHA/EVAL the server has run (INFO commandstats)."""
    stats: dict[str, Any] = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


def set_row(engine: Engine, url: str, **values: Any) -> None:
    """Plain SQL, as an operator would: insert the row for ``url`` or update it."""
    columns = {
        "rate": "rateLimit",
        "cache": "cache",
        "status": "status",
        "shadow": "shadow",
        "per_caller": "perCaller",
    }
    with engine.begin() as conn:
        exists = conn.execute(
            text("select count(*) from t_ratelimite_conf where interfaceUrl = :u"), {"u": url}
        ).scalar_one()
        params = {columns[k]: v for k, v in values.items()} | {"u": url}
        if exists:
            sets = ", ".join(f"{c} = :{c}" for c in params if c != "u")
            conn.execute(
                text(f"update t_ratelimite_conf set {sets} where interfaceUrl = :u"), params
            )
        else:
            cols = [c for c in params if c != "u"]
            conn.execute(
                text(
                    f"insert into t_ratelimite_conf (interfaceUrl, {', '.join(cols)}) "
                    f"values (:u, {', '.join(':' + c for c in cols)})"
                ),
                params,
            )


def set_switch(engine: Engine, enabled: int | None) -> None:
    """Plain SQL on the switch row."""
    with engine.begin() as conn:
        conn.execute(text("update t_ratelimite_switch set enabled = :e"), {"e": enabled})


def limiter(db_url: str, redis_url: str, prefix: str, **settings: Any) -> GatewayLimiter:
    """A started limiter (the caller closes it)."""
    lim = GatewayLimiter(database_url=db_url, redis_url=redis_url, key_prefix=prefix, **settings)
    lim.start()
    return lim


def insert_row(engine: Engine, url: str, **columns: Any) -> int:
    """Plain SQL: insert an enabled row for ``url`` with ``columns`` (named as in the
    table: rateLimit, cache, periodSeconds, perCaller, algorithm...); its configId."""
    values = {"status": 1} | columns
    names = ", ".join(values)
    marks = ", ".join(f":{name}" for name in values)
    with engine.begin() as conn:
        conn.execute(
            text(f"insert into t_ratelimite_conf (interfaceUrl, {names}) values (:u, {marks})"),
            values | {"u": url},
        )
        return int(
            conn.execute(
                text("select max(configId) from t_ratelimite_conf where interfaceUrl = :u"),
                {"u": url},
            ).scalar_one()
        )


def scan_keys(client: redis.Redis) -> set[str]:
    """Every key on the server, by SCAN (decoded; keys the tests make are UTF-8)."""
    return {k.decode("utf-8", "backslashreplace") for k in client.scan_iter(count=1000)}
