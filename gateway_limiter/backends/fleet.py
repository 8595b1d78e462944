"""Fleet membership in Redis: what a heartbeat sends and what its replies mean, no I/O.

Each process is one member of a sorted set, ``<key_prefix>:fleet``, scored by the
moment (ms, the Redis server's clock) it is dead unless it beats again. One heartbeat
is one ``EVAL`` of ``HEARTBEAT_LUA``: it drops the members already dead, adds or renews
this one, and answers the number of live members (N) and the server's time, all in
one round trip and atomically. The set is one key (it has no ``{hash tag}`` and needs
none), so on a Redis Cluster it lives on one master like any key; the interface keys
all carry a ``{...}`` and can never be this name.

A member is its own description (host, pid, since, version and its time to live, as
JSON): it never changes while the process lives, so renewing it is a plain ``ZADD`` and
``gateway-limiter fleet`` can list the members from the set alone. The whole set
expires when nobody beats any longer.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from gateway_limiter.backends.base import BackendError

#: KEYS[1] the set; ARGV[1] the member, ARGV[2] its time to live in ms (0: leave now).
#: With KEYS[2] (the tallies hash) and ARGV[3] (this member's tallies, JSON), the member's
#: live numbers are stored beside it, dropped with it: the lines marked [tallies].
#: Answers {live members, server time in ms}.
HEARTBEAT_LUA = """
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl_ms = tonumber(ARGV[2])
if KEYS[2] then  -- [tallies] the dead lose their tallies with their membership
  local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms, 'LIMIT', 0, 1000)
  if #dead > 0 then redis.call('HDEL', KEYS[2], unpack(dead)) end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
if ttl_ms <= 0 then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], now_ms + ttl_ms, ARGV[1])
  if redis.call('PTTL', KEYS[1]) < ttl_ms then
    redis.call('PEXPIRE', KEYS[1], ttl_ms)
  end
end
if KEYS[2] then  -- [tallies] this member's numbers, expiring with the set
  if ttl_ms <= 0 or ARGV[3] == '' then
    redis.call('HDEL', KEYS[2], ARGV[1])
  else
    redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
    if redis.call('PTTL', KEYS[2]) < ttl_ms then
      redis.call('PEXPIRE', KEYS[2], ttl_ms)
    end
  end
end
return {redis.call('ZCARD', KEYS[1]), now_ms}
"""


def fleet_key(prefix: str) -> str:
    """The sorted set of the fleet's members under ``prefix``."""
    return f"{prefix}:fleet"


def tallies_key(prefix: str) -> str:
    """The hash of the members' tallies: ``{<prefix>:fleet}:tallies``, whose hash tag is
    the set's own name, so both keys live in one slot of a Redis Cluster."""
    return f"{{{fleet_key(prefix)}}}:tallies"


def heartbeat_args(
    prefix: str, member: str, ttl_ms: int, tallies: str | None = None
) -> tuple[Any, ...]:
    """The arguments of ``EVAL`` for one heartbeat (``ttl_ms`` 0: the member leaves);
    ``tallies`` (JSON, ``encode_tallies``) rides along in the same EVAL."""
    if tallies is None:
        return (HEARTBEAT_LUA, 1, fleet_key(prefix), member, ttl_ms)
    return (HEARTBEAT_LUA, 2, fleet_key(prefix), tallies_key(prefix), member, ttl_ms, tallies)


#: The live numbers of one interface: calls admitted, admitted after a wait, refused
#: (per second), and the effective fraction of its rate after pushback (1: all of it).
TALLY_FIELDS = ("admitted", "waited", "refused")


def encode_tallies(rates: dict[str, tuple[float, float, float]], factors: dict[str, float]) -> str:
    """A member's tallies as the heartbeat stores them: {url: [admitted/s, waited/s,
    refused/s, factor]}."""
    shown = {
        url: [*(round(r, 3) for r in rate), round(factors.get(url, 1.0), 4)]
        for url, rate in rates.items()
    }
    for url, factor in factors.items():
        shown.setdefault(url, [0.0, 0.0, 0.0, round(factor, 4)])
    return json.dumps(shown, separators=(",", ":"), sort_keys=True)


def sum_tallies(stored: dict[Any, Any], live: set[str]) -> dict[str, dict[str, float]]:
    """The fleet's numbers per interface: the rates of the ``live`` members summed, the
    effective factor the lowest any member saw. Entries of others are left out."""
    fleet: dict[str, dict[str, float]] = {}
    for raw_member, raw in stored.items():
        member = raw_member.decode() if isinstance(raw_member, bytes) else str(raw_member)
        if member not in live:
            continue
        try:
            tallies = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(tallies, dict):
            continue
        for url, values in tallies.items():
            if not (isinstance(values, list) and len(values) == 4):
                continue
            entry = fleet.setdefault(url, dict.fromkeys(TALLY_FIELDS, 0.0) | {"factor": 1.0})
            for name, value in zip(TALLY_FIELDS, values, strict=False):
                entry[name] = round(entry[name] + float(value), 3)
            entry["factor"] = min(entry["factor"], float(values[3]))
    return fleet


def parse_heartbeat(reply: Any) -> int:
    """The number of live members a heartbeat answered. BackendError if it is no count."""
    try:
        live, _now_ms = reply
        return int(live)
    except (TypeError, ValueError) as e:
        raise BackendError(f"unexpected heartbeat reply {reply!r}") from e


class MemberEntry(NamedTuple):
    """One live member as the set holds it: its description and when it dies (ms)."""

    member: str
    expires_ms: float


def parse_members(
    entries: list[tuple[Any, Any]], time_reply: Any
) -> tuple[list[MemberEntry], float]:
    """``ZRANGE ... WITHSCORES`` and ``TIME`` into the live members and the server's time
    in ms (members already dead but not yet dropped by a heartbeat are left out)."""
    now_ms = int(time_reply[0]) * 1000 + int(time_reply[1]) // 1000
    live = []
    for raw, score in entries:
        member = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        if float(score) > now_ms:
            live.append(MemberEntry(member, float(score)))
    return live, float(now_ms)


def encode_member(host: str, pid: int, since_s: float, version: str, ttl_ms: int) -> str:
    """A member's text: what ``gateway-limiter fleet`` shows of it, as JSON."""
    described = {"host": host, "pid": pid, "since": round(since_s, 3), "version": version}
    return json.dumps(
        described | {"ttl_ms": ttl_ms},
        separators=(",", ":"),
        sort_keys=True,
    )


def decode_member(text: str) -> dict[str, Any]:
    """A member's description (empty for text another program wrote into the set)."""
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
