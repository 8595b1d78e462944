"""A failover that loses writes: a fleet of real processes on one
interface, the Redis master SIGKILLed, its replica promoted by Sentinel or Cluster.

Redis replication is asynchronous: a replica promoted before it received the last
decisions forgets them, and serves buckets fuller than the fleet's real use.
``run_failover`` starts a ``Fleet`` (tests/support/fleet.py) at R = 100/s, C = 100
with unpaced threads, samples the replication lag (the master's
``master_repl_offset`` against the replica's ``slave_repl_offset``) while it runs, kills
the master that holds the bucket, waits for the promotion, and returns what every call
saw. ``FailoverReport`` reads the records: admitted per 1 s window around the kill, and
over the failover period against R x T + C.

Used by tests/faults/test_fault_failover_loses_little.py (which asserts the bound) and
bench/failover_loss.py (which prints the table).
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

import redis

from gateway_limiter.backends.state import bucket_key
from tests.support.clusters import LocalCluster, LocalSentinel, wait_for
from tests.support.fleet import Fleet, WorkerConfig
from tests.support.services import RedisServer

URL = "/fleet/failover"
RATE = 100
CAPACITY = RATE  # maxPermits NULL: one second's worth
PROCESSES = 3
THREADS = 3
#: Before the kill: every process knows N, and the bucket is at its steady state.
WARM_S = 3.0
#: The fleet runs this long after the kill (the promotion takes 1-4 s here).
AFTER_KILL_S = 8.0
#: The failover period starts this long before the kill (the decisions the replica
#: may not have received are in it) and ends this long after Redis decides again.
BEFORE_S = 1.0
SETTLE_AFTER_S = 2.0


class Topology(Protocol):
    """A master holding the bucket, its replica, and how to tell the replica took over."""

    url: str

    def master(self) -> RedisServer:
        """The server that holds the bucket now."""
        ...

    def replica(self) -> RedisServer:
        """The server that replicates it."""
        ...

    def promoted(self, old: RedisServer) -> bool:
        """A server other than ``old`` holds the bucket and answers."""
        ...


class SentinelTopology:
    """The Sentinel fixture: the master the sentinel names, and the other server."""

    def __init__(self, group: LocalSentinel) -> None:
        self.group = group
        self.url = group.url

    def master(self) -> RedisServer:
        """The master the sentinel names."""
        return self.group.server_on(self.group.master_port())

    def replica(self) -> RedisServer:
        """The server that is not the master."""
        port = self.group.master_port()
        return next(s for s in self.group.servers if s.port != port)

    def promoted(self, old: RedisServer) -> bool:
        """The sentinel names another master, and that one says it is a master."""
        port = self.group.master_port()
        if port == old.port:
            return False
        role = self.group.server_on(port).client().info("replication")["role"]
        return bool(role == "master")


class ClusterTopology:
    """The Cluster fixture: the master serving the bucket's slot, and its replica."""

    def __init__(self, cluster: LocalCluster, key: str) -> None:
        self.cluster = cluster
        self.key = key
        self.url = cluster.url

    def _master_port(self) -> int:
        node = self.cluster.running()[0].client()
        slot = int(node.cluster("KEYSLOT", self.key))
        for start, end, master, *_ in node.cluster("SLOTS"):
            if start <= slot <= end:
                return int(master[1])
        raise RuntimeError(f"slot {slot} is not served")

    def master(self) -> RedisServer:
        """The master serving the bucket's slot."""
        return self.cluster.node_on(self._master_port())

    def replica(self) -> RedisServer:
        """The node replicating that master."""
        port = self._master_port()
        for node in self.cluster.running():
            info = node.client().info("replication")
            if info["role"] == "slave" and int(info["master_port"]) == port:
                return node
        raise RuntimeError(f"no replica of the master on port {port}")

    def promoted(self, old: RedisServer) -> bool:
        """Another node serves the slot, and the cluster says it is ok."""
        if self._master_port() == old.port:
            return False
        node = self.cluster.node_on(self._master_port()).client()
        return bool(node.cluster("INFO").get("cluster_state") == "ok")


class LagSampler:
    """Samples how far the replica is behind the master, in replication bytes: the
    replica's offset is read first, then the master's, so a sample errs high."""

    def __init__(self, master: RedisServer, replica: RedisServer) -> None:
        self.master = redis.Redis(host="127.0.0.1", port=master.port, socket_timeout=2)
        self.replica = redis.Redis(host="127.0.0.1", port=replica.port, socket_timeout=2)
        #: (time, master offset, bytes the replica is behind)
        self.samples: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> LagSampler:
        """Sample every 10 ms until ``stop()``."""
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                behind = int(self.replica.info("replication")["slave_repl_offset"])
                ahead = int(self.master.info("replication")["master_repl_offset"])
            except (redis.RedisError, OSError, KeyError):
                return  # the master is gone
            self.samples.append((time.time(), ahead, max(0, ahead - behind)))
            self._stop.wait(0.01)

    def stop(self) -> None:
        """Stop sampling."""
        self._stop.set()
        self._thread.join(5)
        self.master.close()
        self.replica.close()


@dataclass(frozen=True)
class Call:
    """One call: its start and end (s from the kill), admitted, decided by the policy."""

    started: float
    ended: float
    ok: bool
    by_policy: bool


@dataclass(frozen=True)
class FailoverReport:
    """What a fleet admitted around one failover."""

    topology: str
    calls: list[Call]
    #: Seconds from the kill to the sentinel or cluster naming the promoted replica.
    promoted_s: float
    #: Replication lag samples while the master ran: bytes behind.
    lag_bytes: list[int]
    #: Replication bytes per call Redis admitted (heartbeats included), while warm.
    bytes_per_decision: float
    #: Calls Redis admitted per second while warm.
    decisions_per_s: float
    #: Bytes the promoted replica never received: the master's offset read just
    #: before the kill less the replica's just after (errs low by the writes between).
    lost_bytes: int
    errors: list[str]
    capacity: int = CAPACITY
    #: Milliseconds the replica's link was cut before the kill (0: none, the lag is
    #: what replication gives).
    cut_ms: float = 0.0

    def resumed_s(self) -> float:
        """Seconds from the kill to the first call begun after it that the promoted
        replica admitted (a refusal may be made in-process, from the last reply)."""
        after = [c.ended for c in self.calls if c.started > 0 and c.ok and not c.by_policy]
        return min(after) if after else float("inf")

    def admitted_within(self, start: float, end: float) -> int:
        """Admitted calls that began and ended within [start, end] (s from the kill):
        decided within it, whatever the host's delays."""
        return sum(1 for c in self.calls if c.ok and c.started >= start and c.ended <= end)

    def windows(self) -> list[tuple[float, int]]:
        """Admitted per 1 s window, from 2 s before the kill to 3 s after Redis decides
        again: (window start, count)."""
        first, last = -2.0, self.resumed_s() + 3.0
        out = []
        while first + 1.0 <= last:
            out.append((first, self.admitted_within(first, first + 1.0)))
            first += 1.0
        return out

    def most_in_1s(self) -> int:
        """The most admitted in any 1 s window over the failover period (10 ms steps)."""
        start, end = self.period()
        best, first = 0, start
        while first + 1.0 <= end:
            best = max(best, self.admitted_within(first, first + 1.0))
            first += 0.01
        return best

    def period(self) -> tuple[float, float]:
        """The failover period: from ``BEFORE_S`` before the kill to ``SETTLE_AFTER_S``
        after Redis decides again."""
        return -BEFORE_S, self.resumed_s() + SETTLE_AFTER_S

    def lag_decisions(self) -> tuple[float, float]:
        """Median and largest lag seen, in admitted decisions (bytes / bytes per one)."""
        if not self.lag_bytes or self.bytes_per_decision <= 0:
            return 0.0, 0.0
        per = self.bytes_per_decision
        return statistics.median(self.lag_bytes) / per, max(self.lag_bytes) / per

    def figures(self) -> dict[str, Any]:
        """The figures a test prints and the docs quote."""
        start, end = self.period()
        admitted = self.admitted_within(start, end)
        bound = RATE * (end - start) + self.capacity
        median_lag, max_lag = self.lag_decisions()
        return {
            "topology": self.topology,
            "calls": len(self.calls),
            "promoted_s": round(self.promoted_s, 2),
            "resumed_s": round(self.resumed_s(), 2),
            "period_s": round(end - start, 2),
            "admitted_in_period": admitted,
            "bound_R_T_C": round(bound, 1),
            "excess": round(admitted - bound, 1),
            "most_in_1s": self.most_in_1s(),
            "by_policy": sum(1 for c in self.calls if c.ok and c.by_policy),
            "windows": [n for _, n in self.windows()],
            "lag_bytes_median": statistics.median(self.lag_bytes) if self.lag_bytes else 0,
            "lag_bytes_max": max(self.lag_bytes) if self.lag_bytes else 0,
            "lag_samples": len(self.lag_bytes),
            "bytes_per_decision": round(self.bytes_per_decision, 1),
            "lag_decisions_median": round(median_lag, 2),
            "lag_decisions_max": round(max_lag, 2),
            "lag_ms_max": round(1000 * max_lag / self.decisions_per_s, 2)
            if self.decisions_per_s
            else 0.0,
            "lost_bytes": self.lost_bytes,
            "lost_decisions": round(self.lost_bytes / self.bytes_per_decision, 1)
            if self.bytes_per_decision
            else 0.0,
            "capacity": self.capacity,
            "cut_ms": self.cut_ms,
            "errors": len(self.errors),
        }


def run_failover(
    database_url: str,
    topology: Topology,
    name: str,
    key_prefix: str,
    *,
    settings: dict[str, Any] | None = None,
    capacity: int = CAPACITY,
    cut_ms: float = 0.0,
) -> FailoverReport:
    """One run on ``topology`` (named ``name`` in the report): the fleet warms up,
    the master holding the bucket is SIGKILLed, the replica takes over. The killed
    server stays down (the caller's fixture stops everything).

    ``capacity``: the row's ``maxPermits`` as written (the report's C; the caller
    writes the row). ``cut_ms`` > 0: that long before the kill the master takes a
    password and drops its replica's link (``CLIENT KILL TYPE replica``), so the
    replica misses that many milliseconds of decisions (``lost_bytes`` says what was
    really lost); the fleet's open connections go on, a new one is refused (the
    policy decides that call)."""
    config = WorkerConfig(
        database_url=database_url,
        redis_url=topology.url,
        key_prefix=key_prefix,
        urls=[URL],
        seconds=WARM_S + AFTER_KILL_S,
        threads=THREADS,
        pause=0.003,
        settings=settings or {},
    )
    master, replica = topology.master(), topology.replica()

    def in_sync() -> bool:
        # a fresh cluster says ok before its replicas finish their first sync
        info = replica.client().info("replication")
        ahead = int(master.client().info("replication")["master_repl_offset"])
        return info["master_link_status"] == "up" and int(info["slave_repl_offset"]) == ahead

    wait_for("the replica to be in sync", in_sync, 30)
    fleet = Fleet(config, PROCESSES)
    sampler = LagSampler(master, replica)
    try:
        start = fleet.start()
        # real time: warm traffic, a second into the fleet's run
        time.sleep(max(0.0, start + 1.0 - time.time()))
        sampler.start()
        # real time: warm traffic until WARM_S
        time.sleep(max(0.0, start + WARM_S - time.time()))
        sampler.stop()
        watch = redis.Redis(host="127.0.0.1", port=master.port, socket_timeout=2)
        if cut_ms > 0:
            # A replica whose link drops reconnects at once; a password it does not
            # know keeps it out. Connections already open (the fleet's) stay in.
            watch.config_set("requirepass", uuid.uuid4().hex)
            watch.execute_command("CLIENT", "KILL", "TYPE", "replica")  # type: ignore[no-untyped-call]
            # real time: the replica cut off for cut_ms
            time.sleep(cut_ms / 1000)
        final = int(watch.info("replication")["master_repl_offset"])
        killed = time.time()
        master.kill()
        watch.close()
        lost = max(0, final - int(replica.client().info("replication")["slave_repl_offset"]))
        wait_for("the replica to take over", lambda: topology.promoted(master), AFTER_KILL_S)
        promoted = time.time()
        results = fleet.results()
    finally:
        sampler.stop()
        fleet.kill()
    calls = [
        Call(started - killed, started + took - killed, ok, by_policy)
        for r in results
        for started, took, ok, by_policy, _ in r["calls"]
    ]
    samples = sampler.samples
    bytes_per_decision = 0.0
    decisions_per_s = 0.0
    if len(samples) >= 2:
        (t0, o0, _), (t1, o1, _) = samples[0], samples[-1]
        decided = sum(
            1
            for c in calls
            if c.ok and not c.by_policy and t0 - killed <= c.started and c.ended <= t1 - killed
        )
        if decided:
            bytes_per_decision = (o1 - o0) / decided
            decisions_per_s = decided / (t1 - t0)
    return FailoverReport(
        topology=name,
        calls=calls,
        promoted_s=promoted - killed,
        lag_bytes=[behind for _, _, behind in samples],
        bytes_per_decision=bytes_per_decision,
        decisions_per_s=decisions_per_s,
        lost_bytes=lost,
        errors=[e for r in results for e in r["errors"]],
        capacity=capacity,
        cut_ms=cut_ms,
    )


def cluster_topology(cluster: LocalCluster, key_prefix: str) -> ClusterTopology:
    """The cluster's master serving the failover URL's bucket under ``key_prefix``."""
    return ClusterTopology(cluster, bucket_key(key_prefix, URL))
