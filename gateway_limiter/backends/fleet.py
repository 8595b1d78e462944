"""Fleet membership in Redis: what a heartbeat sends and what its replies mean, no I/O.

Each process is one member of a sorted set, ``<key_prefix>:fleet``, scored by the
moment (ms, the Redis server's clock) it is dead unless it beats again. One heartbeat
is one ``EVAL`` of ``HEARTBEAT_LUA``: it drops the members already dead, adds or renews
this one, records its recent demand per interface and answers the number of live
members (N), the server's time and this member's claim on each of those interfaces
(its demand-weighted share of the rule, the claims of all members adding up to at most
1), all in one round trip and atomically. The set has no ``{hash tag}``; the two hashes
beside it carry the set's name as theirs, so on a Redis Cluster all three live on one
master; the interface keys (``<prefix>:{url}:...``) can never be these names.

A member is its own description (host, pid, since, version and its time to live, as
JSON): it never changes while the process lives, so renewing it is a plain ``ZADD`` and
``gateway-limiter fleet`` can list the members from the set alone. The whole set
expires when nobody beats any longer.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from gateway_limiter.backends.base import BackendError

#: KEYS[1] the set; KEYS[2] each member's demand and claims (a hash: member -> JSON
#: {url: [demand, claim]}); KEYS[3] the fleet's totals per interface (a hash:
#: "d:<url>" -> demand, "c:<url>" -> claims). ARGV[1] the member, ARGV[2] its time to
#: live in ms (0: leave now), ARGV[3] its demand as JSON {url: calls/s} ("": none).
#: Answers {live members, server time in ms, {url, claim, url, claim, ...}}.
#:
#: A member's claim on an interface is 0.95 of its demand's part of the fleet's demand
#: (a live member that has not reported yet counts as the average one; the 5 % left
#: over absorbs the swings of demand between two members' heartbeats, which would
#: otherwise squeeze whoever beats next down to nothing), but never more than
#: what the other members' claims leave of 1: claims change only in
#: here, atomically, so the claims the set holds add up to at most 1 at every moment,
#: and each member decides an outage by the claim it last got (``core/fleet.py``).
#: The work is O(dead members + this member's interfaces): the totals are kept as
#: they change, never summed over the set.
#:
#: [tallies] KEYS[4] the members' tallies (a hash: member -> JSON), ARGV[4] this
#: member's live numbers (``encode_tallies``; "" none, "-" leave them as they are):
#: stored beside the member and dropped with it, for the console (lines [tallies]).
HEARTBEAT_LUA = """
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl_ms = tonumber(ARGV[2])
local function release(member)
  local raw = redis.call('HGET', KEYS[2], member)
  if not raw then return end
  for url, dc in pairs(cjson.decode(raw)) do
    redis.call('HINCRBYFLOAT', KEYS[3], 'd:' .. url, -dc[1])
    redis.call('HINCRBYFLOAT', KEYS[3], 'c:' .. url, -dc[2])
  end
  redis.call('HDEL', KEYS[2], member)
end
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms)
if #dead > 0 then
  for _, m in ipairs(dead) do
    release(m)
    redis.call('HDEL', KEYS[4], m)  -- [tallies]
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
end
release(ARGV[1])
if ttl_ms <= 0 then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[4], ARGV[1])  -- [tallies]
  return {redis.call('ZCARD', KEYS[1]), now_ms, {}}
end
redis.call('ZADD', KEYS[1], now_ms + ttl_ms, ARGV[1])
for i = 1, 3 do
  if redis.call('PTTL', KEYS[i]) < ttl_ms then
    redis.call('PEXPIRE', KEYS[i], ttl_ms)
  end
end
local claims = {}
if ARGV[3] ~= '' then
  local demand = cjson.decode(ARGV[3])
  -- members that have not reported yet count as the average reporter
  local live = redis.call('ZCARD', KEYS[1])
  local reporters = redis.call('HLEN', KEYS[2]) + 1
  local scale = math.max(1, live / reporters)
  local total = {}
  for url, d in pairs(demand) do
    total[url] = tonumber(redis.call('HINCRBYFLOAT', KEYS[3], 'd:' .. url, d)) * scale
  end
  local mine = {}
  for url, d in pairs(demand) do
    local taken = tonumber(redis.call('HGET', KEYS[3], 'c:' .. url) or '0')
    local want = 0
    if total[url] > 0 then want = 0.95 * d / total[url] end
    local c = math.floor(math.min(want, 1 - taken - 1e-9) * 1e6) / 1e6
    if c < 0 then c = 0 end
    redis.call('HINCRBYFLOAT', KEYS[3], 'c:' .. url, c)
    mine[url] = {d, c}
    claims[#claims + 1] = url
    claims[#claims + 1] = tostring(c)
  end
  redis.call('HSET', KEYS[2], ARGV[1], cjson.encode(mine))
end
if ARGV[4] ~= '-' then  -- [tallies] this member's numbers, expiring with the set
  if ARGV[4] == '' then
    redis.call('HDEL', KEYS[4], ARGV[1])
  else
    redis.call('HSET', KEYS[4], ARGV[1], ARGV[4])
    if redis.call('PTTL', KEYS[4]) < ttl_ms then
      redis.call('PEXPIRE', KEYS[4], ttl_ms)
    end
  end
end
return {redis.call('ZCARD', KEYS[1]), now_ms, claims}
"""


def fleet_key(prefix: str) -> str:
    """The sorted set of the fleet's members under ``prefix``."""
    return f"{prefix}:fleet"


def fleet_keys(prefix: str) -> tuple[str, str, str]:
    """The set, the members' demand and claims, and the totals: one Cluster slot (the
    other two carry the set's name as their ``{hash tag}``; a prefix has no braces)."""
    return fleet_key(prefix), f"{{{prefix}:fleet}}:demand", f"{{{prefix}:fleet}}:totals"


def tallies_key(prefix: str) -> str:
    """The hash of the members' tallies: ``{<prefix>:fleet}:tallies``, whose hash tag is
    the set's own name, so both keys live in one slot of a Redis Cluster."""
    return f"{{{fleet_key(prefix)}}}:tallies"


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


def heartbeat_args(
    prefix: str, member: str, ttl_ms: int, demand: str = "", tallies: str | None = None
) -> tuple[Any, ...]:
    """The arguments of ``EVAL`` for one heartbeat (``ttl_ms`` 0: the member leaves;
    ``demand``: ``encode_demand``'s JSON, "" for none); ``tallies`` (JSON,
    ``encode_tallies``), when given, rides along in the same EVAL."""
    keys = (*fleet_keys(prefix), tallies_key(prefix))
    return (HEARTBEAT_LUA, 4, *keys, member, ttl_ms, demand, "-" if tallies is None else tallies)


class Heartbeat(NamedTuple):
    """What a heartbeat answered: the live members, and this member's claim per
    interface it reported demand for (a part of the rule, 0 to 1)."""

    live: int
    claims: dict[str, float]


def encode_demand(demand: dict[str, float]) -> str:
    """A member's demand (calls per second per interface) as the heartbeat sends it."""
    return json.dumps({url: round(rate, 6) for url, rate in demand.items()}, separators=(",", ":"))


def parse_heartbeat(reply: Any) -> Heartbeat:
    """The live members and claims a heartbeat answered. BackendError if it is not that."""
    try:
        live, _now_ms, flat = reply
        texts = [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in flat]
        claims = {texts[i]: float(texts[i + 1]) for i in range(0, len(texts) - 1, 2)}
        return Heartbeat(int(live), claims)
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


def members_reply(
    entries: list[tuple[Any, Any]], time_reply: Any
) -> tuple[list[tuple[str, float]], float]:
    """What a backend's ``members`` answers: ``parse_members``' live members as
    (member, expires at ms) pairs, and the server's time in ms."""
    live, now_ms = parse_members(entries, time_reply)
    return list(live), now_ms


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
