"""Helpers for tests that run a real limiter on real services."""

from __future__ import annotations

import re
from typing import Any, cast

import redis
from sqlalchemy import Engine, Table, text

from gateway_limiter import GatewayLimiter
from gateway_limiter.backends.fleet import fleet_key
from gateway_limiter.config.table import RateLimitConf

#: The limits table as a Core Table (the model's __table__ is typed as a FromClause).
CONF = cast(Table, RateLimitConf.__table__)


def evalsha_calls(client: redis.Redis) -> int:
    """How many decisions the server has run: EVALSHA calls (INFO commandstats).

    Decisions are always EVALSHA; the fleet's heartbeats (one EVAL per process per
    ``fleet_heartbeat``, docs/design.md) are left out, so they never blur a count.
    """
    stats: dict[str, Any] = client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def write_row(engine: Engine, url: str, *, add: bool = False, **columns: Any) -> int:
    """Plain SQL, as an operator would write it: the limit row of ``url``; its configId.

    ``columns`` are named as in the table (rateLimit, cache, status, shadow, perCaller,
    periodSeconds, algorithm, maxPermits, warmupPeriod...). A new row is enabled unless
    ``status`` says otherwise. Without ``add``, the row of ``url`` is updated with just
    ``columns`` when there is one, and inserted when there is none; with ``add=True`` a
    new row goes in beside any others of ``url`` (limits of other periods or scopes).
    """
    with engine.begin() as conn:
        ids = [
            int(i)
            for i in conn.execute(
                text("select configId from t_ratelimite_conf where interfaceUrl = :u"), {"u": url}
            ).scalars()
        ]
        if ids and not add:
            if len(ids) > 1:
                raise ValueError(f"{url!r} has {len(ids)} rows (configId {ids}): which one?")
            sets = ", ".join(f"{name} = :{name}" for name in columns)
            conn.execute(
                text(f"update t_ratelimite_conf set {sets} where configId = :id"),
                columns | {"id": ids[0]},
            )
            return ids[0]
        values = {"status": 1} | columns
        names = ", ".join(values)
        marks = ", ".join(f":{name}" for name in values)
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


def set_switch(engine: Engine, enabled: int | None) -> None:
    """Plain SQL on the switch row."""
    with engine.begin() as conn:
        conn.execute(text("update t_ratelimite_switch set enabled = :e"), {"e": enabled})


def limiter(db_url: str, redis_url: str, prefix: str, **settings: Any) -> GatewayLimiter:
    """A started limiter (the caller closes it)."""
    lim = GatewayLimiter(database_url=db_url, redis_url=redis_url, key_prefix=prefix, **settings)
    lim.start()
    return lim


def scan_keys(client: redis.Redis) -> set[str]:
    """Every key of limit state on the server, by SCAN (decoded; keys the tests make are
    UTF-8): all keys but the fleets' (``<prefix>:fleet`` and its demand, totals and
    tallies hashes, ``{<prefix>:fleet}:...``, docs/design.md and docs/console.md)."""
    keys = {k.decode("utf-8", "backslashreplace") for k in client.scan_iter(count=1000)}
    return {k for k in keys if not _FLEET_KEY.fullmatch(k)}


def state_keys(client: redis.Redis, prefix: str) -> list[str]:
    """The keys of limit state under ``prefix`` (SCAN), without the fleet's member set."""
    found = client.scan_iter(f"{prefix}:*", count=1000)
    keys = (k.decode("utf-8", "backslashreplace") for k in found)
    return [k for k in keys if k != fleet_key(prefix)]


#: A fleet's member set (a prefix, which has no braces, and ``:fleet``) and its hashes.
_FLEET_KEY = re.compile(r"[^{}]*:fleet|\{[^{}]*:fleet\}:(demand|totals|tallies)")
