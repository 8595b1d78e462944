"""The console's live numbers ride the fleet heartbeat: one EVAL stores a member's tallies
beside its membership (same slot on a Redis Cluster, so the script may touch both), the
sum covers live members only, and a member that leaves takes its tallies with it."""

from __future__ import annotations

import json

import pytest

from gateway_limiter.backends.fleet import encode_member, encode_tallies, tallies_key
from gateway_limiter.backends.schemes import open_backend
from gateway_limiter.config.settings import Settings
from tests.support.clusters import LocalCluster
from tests.support.services import RedisServer


def member(pid: int) -> str:
    return encode_member("host", pid, 0.0, "test", 5000)


@pytest.mark.parametrize("where", ["redis", "cluster"])
def test_tallies_are_summed_over_live_members_and_leave_with_them(
    where: str, request: pytest.FixtureRequest, key_prefix: str
) -> None:
    if where == "cluster":
        cluster: LocalCluster = request.getfixturevalue("redis_cluster")
        url = cluster.url
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        url = server.url
    backend = open_backend(Settings(redis_url=url, key_prefix=key_prefix, redis_timeout=2))
    try:
        one = encode_tallies({"/a": (10.0, 2.0, 5.0)}, {})
        two = encode_tallies({"/a": (6.0, 0.0, 1.0), "/b": (1.0, 0.0, 0.0)}, {"/a": 0.5})
        assert backend.heartbeat(member(1), 5000, tallies=one).live == 1
        assert backend.heartbeat(member(2), 5000, tallies=two).live == 2
        summed = backend.fleet_tallies()  # type: ignore[attr-defined]
        assert summed["/a"] == {"admitted": 16.0, "waited": 2.0, "refused": 6.0, "factor": 0.5}
        assert summed["/b"]["admitted"] == 1.0
        # A beat without tallies (the first, at start) leaves them as they are.
        assert backend.heartbeat(member(2), 5000).live == 2
        assert backend.fleet_tallies()["/b"]["admitted"] == 1.0  # type: ignore[attr-defined]
        assert backend.heartbeat(member(2), 0).live == 1  # member 2 leaves
        assert "/b" not in backend.fleet_tallies()  # type: ignore[attr-defined]
        stored = json.loads(
            backend._server(tallies_key(key_prefix)).hget(  # type: ignore[attr-defined]
                tallies_key(key_prefix), member(1)
            )
        )
        assert stored["/a"][:3] == [10.0, 2.0, 5.0]
    finally:
        backend.close()
