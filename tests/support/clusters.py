"""Real Redis Clusters and Sentinel groups for the tests, on free ports.

``LocalCluster``: N masters (and R replicas each) of ``redis-server --cluster-enabled``,
joined with ``redis-cli --cluster create``. ``LocalSentinel``: a master, a replica and a
sentinel (``redis-server --sentinel``) watching them. Either one stops every process it
started, even when starting fails half-way. Under CI=true a missing binary fails.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from tests.support.services import RedisServer, free_port, require

#: Node timeout of the test clusters: a dead master is failed over about 2 s later.
NODE_TIMEOUT_MS = 1000


def wait_for(what: str, check: Callable[[], bool], seconds: float = 20.0) -> None:
    """Poll ``check`` until it holds; RuntimeError naming ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (redis.RedisError, OSError):
            pass
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


def cluster_node() -> RedisServer:
    """A redis-server ready to join a cluster (its bus on a free port of its own)."""
    return RedisServer(
        "--cluster-enabled", "yes",
        "--cluster-config-file", "nodes.conf",
        # the bus port defaults to port + 10000, past 65535 for a high free port
        "--cluster-port", str(free_port()),
        "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
        # a replica whose master died long ago may still take over (tests kill freely)
        "--cluster-replica-validity-factor", "0",
    )  # fmt: skip


class LocalCluster:
    """A Redis Cluster of ``masters`` masters with ``replicas`` replicas each."""

    def __init__(self, masters: int = 3, replicas: int = 0) -> None:
        self.masters = masters
        self.replicas = replicas
        self.nodes: list[RedisServer] = []

    def planned(self) -> list[RedisServer]:
        """The nodes, ports chosen but not started yet (so a test can name the cluster in
        a URL before it runs)."""
        if not self.nodes:
            self.nodes = [cluster_node() for _ in range(self.masters * (1 + self.replicas))]
        return self.nodes

    @property
    def url(self) -> str:
        """``redis+cluster://`` URL naming every node (planned, if not started yet)."""
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.planned())
        return f"redis+cluster://{hosts}"

    def start(self) -> LocalCluster:
        """Start the nodes, create the cluster, wait until every node says it is ok."""
        cli = shutil.which("redis-cli")
        if cli is None:
            require("redis-cli", "not on PATH")
        try:
            for node in self.planned():
                node.start()
            addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
            subprocess.run(
                [str(cli), "--cluster", "create", *addresses,
                 "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                check=True, capture_output=True, timeout=60,
            )  # fmt: skip
            self.wait_healthy()
            self.wait_replicas_synced()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_replicas_synced(self, seconds: float = 30.0) -> None:
        """Until every replica has its master's data (``master_link_status:up``): the
        cluster says ok before that, and a test that kills a master at once would meet a
        replica still loading its first sync."""

        def synced() -> bool:
            for node in self.running():
                info = node.client().info("replication")
                if info.get("role") == "slave" and info.get("master_link_status") != "up":
                    return False
            return True

        wait_for("every replica in sync with its master", synced, seconds)

    def force_failover_of(self, master: RedisServer) -> None:
        """Make ``master``'s replica take over now (``CLUSTER FAILOVER FORCE``), for a
        test about what clients do across a failover rather than about Redis' election,
        which a starved host can delay past any bound. A no-op once a replica has."""
        for node in self.running():
            role = node.client().execute_command("ROLE")  # type: ignore[no-untyped-call]
            if role[0] in (b"slave", "slave") and int(role[2]) == master.port:
                with contextlib.suppress(redis.ResponseError):  # promoted meanwhile
                    node.client().execute_command("CLUSTER", "FAILOVER", "FORCE")  # type: ignore[no-untyped-call]

    def wait_healthy(self, seconds: float = 30.0) -> None:
        """Until every running node reports cluster_state:ok and all masters serve slots."""

        def healthy() -> bool:
            for node in self.running():
                if node.client().cluster("INFO").get("cluster_state") != "ok":
                    return False
            return len(self.master_ports()) == self.masters

        wait_for("cluster_state:ok on every node", healthy, seconds)

    def running(self) -> list[RedisServer]:
        """The nodes whose process is up."""
        return [n for n in self.nodes if n.proc is not None]

    def client(self) -> redis.RedisCluster:
        """A plain cluster client (generous timeouts) for a test's own checks."""
        node = self.running()[0]
        return redis.RedisCluster(host="127.0.0.1", port=node.port, socket_timeout=5)

    def master_ports(self) -> set[int]:
        """Ports of the masters that serve slots, as a running node sees them."""
        slots = self.running()[0].client().cluster("SLOTS")
        return {int(entry[2][1]) for entry in slots}

    def node_on(self, port: int) -> RedisServer:
        """The node listening on ``port``."""
        return next(n for n in self.nodes if n.port == port)

    def stop(self) -> None:
        """Kill every node and remove its directory."""
        for node in self.nodes:
            node.stop()


def sentinel_config(directory: Path, port: int, master_port: int, service: str) -> Path:
    """A sentinel's config file (it rewrites it, so it is a file of its own)."""
    path = directory / "sentinel.conf"
    path.write_text(
        f"port {port}\n"
        "bind 127.0.0.1\n"
        f"dir {directory}\n"
        f"sentinel monitor {service} 127.0.0.1 {master_port} 1\n"
        f"sentinel down-after-milliseconds {service} {NODE_TIMEOUT_MS}\n"
        f"sentinel failover-timeout {service} 10000\n"
        f"sentinel parallel-syncs {service} 1\n"
    )
    return path


class LocalSentinel:
    """A master, a replica of it, and one sentinel watching them as ``service``."""

    def __init__(self, service: str = "gwl") -> None:
        self.service = service
        self.servers: list[RedisServer] = []
        self.sentinel_port = free_port()
        self.sentinel_dir: Path | None = None
        self.sentinel_proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis+sentinel://`` URL of the sentinel and the service."""
        return f"redis+sentinel://127.0.0.1:{self.sentinel_port}/{self.service}"

    def start(self) -> LocalSentinel:
        """Start master, replica (synced) and sentinel (which has found the replica)."""
        binary = shutil.which("redis-server")
        if binary is None:
            require("redis-server", "not on PATH")
        try:
            master = RedisServer().start()
            self.servers.append(master)
            replica = RedisServer("--replicaof", "127.0.0.1", str(master.port)).start()
            self.servers.append(replica)
            wait_for(
                "the replica to sync",
                lambda: replica.client().info("replication")["master_link_status"] == "up",
            )
            self.sentinel_dir = Path(replica.dir) / "sentinel"
            self.sentinel_dir.mkdir()
            config = sentinel_config(
                self.sentinel_dir, self.sentinel_port, master.port, self.service
            )
            self.sentinel_proc = subprocess.Popen(
                [str(binary), str(config), "--sentinel"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            wait_for(
                "the sentinel to see the replica",
                lambda: len(self.sentinel().sentinel_slaves(self.service)) == 1,
            )
        except BaseException:
            self.stop()
            raise
        return self

    def sentinel(self) -> redis.Redis:
        """A client on the sentinel."""
        return redis.Redis(host="127.0.0.1", port=self.sentinel_port, socket_timeout=5)

    def master_port(self) -> int:
        """The port of the master the sentinel names now."""
        address: Any = self.sentinel().sentinel_get_master_addr_by_name(self.service)
        return int(address[1])

    def server_on(self, port: int) -> RedisServer:
        """The Redis server listening on ``port``."""
        return next(s for s in self.servers if s.port == port)

    def stop(self) -> None:
        """Kill the sentinel and the servers."""
        if self.sentinel_proc is not None:
            self.sentinel_proc.kill()
            self.sentinel_proc.wait(10)
            self.sentinel_proc = None
        for server in self.servers:
            server.stop()
