"""The scripts need no more than Redis 5 (docs/design.md, "Services it needs"): the
renewal of slot leases never shortens a lease without ``ZADD ... GT`` (Redis 6.2),
and no script names a command or option newer than 5.0."""

from __future__ import annotations

import re

import redis

from gateway_limiter import GatewayLimiter
from gateway_limiter.backends.fleet import HEARTBEAT_LUA
from gateway_limiter.backends.scripts import SCRIPTS
from gateway_limiter.backends.slots import parse_counts, renew_call, slot_keys

#: Commands, options and Lua calls that Redis 5.0 does not have (with the version that
#: brought them). A word that is also an older command's name (GET) is left out.
NEWER_THAN_5 = {
    "GT": "6.2 (ZADD)",
    "LT": "6.2 (ZADD)",
    "KEEPTTL": "6.0 (SET)",
    "EXAT": "6.2",
    "PXAT": "6.2",
    "GETEX": "6.2",
    "GETDEL": "6.2",
    "LMOVE": "6.2",
    "BLMOVE": "6.2",
    "LPOS": "6.0.6",
    "ZRANGESTORE": "6.2",
    "ZUNION": "6.2",
    "ZINTER": "6.2",
    "ZDIFF": "6.2",
    "ZMSCORE": "6.2",
    "ZRANDMEMBER": "6.2",
    "HRANDFIELD": "6.2",
    "SMISMEMBER": "6.2",
    "COPY": "6.2",
    "BYSCORE": "6.2 (ZRANGE)",
    "BYLEX": "6.2 (ZRANGE)",
    "LMPOP": "7.0",
    "ZMPOP": "7.0",
    "SINTERCARD": "7.0",
    "EXPIRETIME": "7.0",
    "PEXPIRETIME": "7.0",
    "redis.setresp": "6.0",
    "redis.REDIS_VERSION": "7.0",
}


def test_no_script_names_a_command_or_option_newer_than_redis_5() -> None:
    sources = {**SCRIPTS, "heartbeat": HEARTBEAT_LUA}
    found = {
        (name, word, NEWER_THAN_5[word])
        for name, source in sources.items()
        for word in re.findall(r'"([A-Z]+)"|(redis\.[A-Za-z_]+)', source)
        for word in [w for w in word if w]
        if word in NEWER_THAN_5
    }
    assert found == set()


def test_a_renewal_never_shortens_a_lease_and_brings_none_back(
    lim: GatewayLimiter, redis_client: redis.Redis, key_prefix: str
) -> None:
    url = "/renew/redis5"
    leases = slot_keys(key_prefix, url)[0]
    seconds, micros = redis_client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    far = now_ms + 3_600_000  # a lease held through a long rate wait
    redis_client.zadd(leases, {"long": far, "short": now_ms + 2_000})
    reply = lim.backend.script(renew_call(key_prefix, url, ["long", "short", "gone"], 10.0))
    assert parse_counts(reply) == (2, 2)
    assert redis_client.zscore(leases, "long") == far  # not shortened
    short = redis_client.zscore(leases, "short")
    assert short is not None and now_ms + 9_000 <= short <= now_ms + 12_000  # renewed
    assert redis_client.zscore(leases, "gone") is None  # not brought back
