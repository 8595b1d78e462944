#!/usr/bin/env python
"""ShouldRateLimit calls per second against one `gateway-limiter rls` process on one
Redis, next to empty gRPC servers and the same decisions made in-process; p50 and p99
latency, and the CPU each call cost the answering process.

Run from the checkout, with the venv's Python (extra ``rls``) and ``h2load`` on PATH
(Debian: ``apt-get install nghttp2-client``)::

    python bench/rls.py            # about a minute
    python bench/rls.py --quick    # smoke run, a few seconds
    python bench/rls.py --client grpcio   # a grpc.aio client in this process instead

The client is ``h2load``, one thread in C: gRPC unary calls over h2c (POST of one
length-prefixed RateLimitRequest, ``content-type: application/grpc``, ``te: trailers``),
``--in-flight`` streams in all over 1 and over 8 connections, a warm-up run and then a
timed one; latency per call from its log. It costs a fraction of what a server spends
per call (its column), so the servers get the machine's cores rather than sharing them
with a Python client. Each answer is checked: the server's own count (the service's
``gateway_limiter_rls_requests_total`` by code, the empty servers' count) must match
what h2load received, with no ``error`` or ``invalid_argument``; and one call to each
server by ``nghttp`` (the same package) must end with the trailer ``grpc-status: 0``
and the answer expected (OVER_LIMIT for more permits than the refusing row holds).

Servers, each in a process of its own: an empty ``grpc.aio`` server and an empty
threaded one (``grpc.server``, one worker) whose ``ShouldRateLimit`` answers OK at once
(the gRPC layer alone, its ceiling on this machine); the service, ``python -m
gateway_limiter rls`` as shipped (metrics on), with one and with two descriptors (two
interfaces decided together in one ``descriptors.lua`` call) on rows of 10,000,000/s
that never refuse; and once on a row of 1,000/s, whose refusals (OVER_LIMIT, counted by
the service) check the answers are decisions. In-process: the same requests decided by
``Judge.judge`` and answered by ``answers.answer`` on an ``AsyncGatewayLimiter`` in this
process, the same number in flight, and once with one call in flight (each call its own
Redis round trip): what the service does less the gRPC layer. CPU per call (user +
system of the answering process) is the figure a busy, shared host moves least: one
core answers 1 s / that. docs/envoy.md has measured figures.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import math
import os
import re
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

# Run as a script from anywhere: the checkout's package wins over any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc
import redis
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.harness.args import description, positive_float, positive_int
from bench.harness.limiters import OPEN_RATE, sqlite_table
from bench.harness.report import load_average, machine_facts, table, version
from bench.harness.servers import cpu_seconds, free_port, private_redis
from bench.harness.stats import percentile
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.rls.answers import answer
from gateway_limiter.rls.descriptors import Wanted
from gateway_limiter.rls.judge import Judge

URLS = ("/bench/rls/a", "/bench/rls/b")
SERVICE = "envoy.service.ratelimit.v3.RateLimitService"
ROOT = Path(__file__).resolve().parent.parent


def request(descriptors: int, urls: tuple[str, ...] = URLS, hits: int = 0) -> Any:
    """A request naming the first ``descriptors`` interfaces of ``urls``, asking for
    ``hits`` permits (0: one)."""
    return rls_pb2.RateLimitRequest(
        domain="bench",
        hits_addend=hits,
        descriptors=[
            ratelimit_pb2.RateLimitDescriptor(
                entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key="interface", value=url)]
            )
            for url in urls[:descriptors]
        ],
    )


#: What a row measured: calls/s, p50 and p99 (ms), refusals, and the deciding process's
#: CPU (user + system) per call, µs
Result = tuple[float, float, float, int, float]


async def measure(
    call: Callable[[], Awaitable[bool]],
    in_flight: int,
    warmup_s: float,
    seconds: float,
    pid: int | None = None,
) -> Result:
    """``in_flight`` tasks calling in a loop: calls/s, p50 and p99 (ms), refusals, and
    the CPU per call of process ``pid`` (None: this one)."""

    def cpu() -> float:
        return time.process_time() if pid is None else cpu_seconds(pid)

    counting = stop = False
    latencies: list[float] = []
    refused = 0

    async def worker() -> None:
        nonlocal refused
        while not stop:
            began = time.perf_counter()
            ok = await call()
            if counting:
                latencies.append(time.perf_counter() - began)
                refused += not ok

    tasks = [asyncio.create_task(worker()) for _ in range(in_flight)]
    try:
        await asyncio.sleep(warmup_s)
        counting, began, cpu_began = True, time.perf_counter(), cpu()
        await asyncio.sleep(seconds)
        counting, took, cpu_took = False, time.perf_counter() - began, cpu() - cpu_began
    finally:
        stop = True
        await asyncio.gather(*tasks)
    ms = [x * 1000 for x in latencies]
    per_call_us = cpu_took / max(1, len(ms)) * 1e6
    return len(ms) / took, percentile(ms, 0.5), percentile(ms, 0.99), refused, per_call_us


#: Seconds a server gets to answer its health check once started.
START_S = 120

#: The floor's request that asks how many calls it answered (``limit_remaining``).
COUNT_DOMAIN = "bench-count"


def count_reply(answered: int) -> Any:
    """A floor's answer to a ``COUNT_DOMAIN`` request: the calls it answered."""
    return rls_pb2.RateLimitResponse(
        overall_code=rls_pb2.RateLimitResponse.OK,
        statuses=[rls_pb2.RateLimitResponse.DescriptorStatus(limit_remaining=answered)],
    )


class Floor(rls_pb2_grpc.RateLimitServiceServicer):  # type: ignore[misc]
    """``ShouldRateLimit`` answering OK at once: the gRPC layer alone (``grpc.aio``)."""

    answered = 0

    async def ShouldRateLimit(self, request: Any, context: Any) -> Any:
        if request.domain == COUNT_DOMAIN:
            return count_reply(self.answered)
        self.answered += 1
        return rls_pb2.RateLimitResponse(overall_code=rls_pb2.RateLimitResponse.OK)


class SyncFloor(rls_pb2_grpc.RateLimitServiceServicer):  # type: ignore[misc]
    """The same on grpc's threaded server (``grpc.server``)."""

    answered = 0

    def ShouldRateLimit(self, request: Any, context: Any) -> Any:
        if request.domain == COUNT_DOMAIN:
            return count_reply(self.answered)
        self.answered += 1  # one worker thread: no lock needed
        return rls_pb2.RateLimitResponse(overall_code=rls_pb2.RateLimitResponse.OK)


async def serve_floor(port: int) -> None:
    """The ``grpc.aio`` floor, with the health service, until killed."""
    from grpc_health.v1.health import aio as health_aio

    server = grpc.aio.server(options=SERVER_OPTIONS)
    rls_pb2_grpc.add_RateLimitServiceServicer_to_server(Floor(), server)
    health = health_aio.HealthServicer()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def serve_sync_floor(port: int) -> None:
    """The threaded floor (one worker thread: more only contend for the GIL), until
    killed."""
    from concurrent import futures

    from grpc_health.v1 import health

    server = grpc.server(futures.ThreadPoolExecutor(1), options=SERVER_OPTIONS)
    rls_pb2_grpc.add_RateLimitServiceServicer_to_server(SyncFloor(), server)
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


#: The floors' server options: the service's own (gateway_limiter/rls/server.py).
SERVER_OPTIONS = [("grpc.so_reuseport", 0), ("grpc.max_concurrent_streams", 1000)]


def start_service(
    settings: Path | None, port: int, metrics_port: int | None = None, floor: str = "aio"
) -> subprocess.Popen[bytes]:
    """``python -m gateway_limiter rls`` (no ``settings``: the ``floor`` server, ``aio``
    or ``sync``), once it answers its health check."""
    if settings is None:
        command = [sys.executable, str(Path(__file__).resolve()), f"--serve-{floor}", str(port)]
    else:
        command = [
            *(sys.executable, "-m", "gateway_limiter", "--settings", str(settings)),
            *("rls", "--listen", f"127.0.0.1:{port}"),
        ]
        if metrics_port is not None:
            command += ["--metrics-port", str(metrics_port)]
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "GATEWAY_LIMITER_SETTINGS": ""},
    )
    # a loaded host (a CI run, its other benchmarks beside) can take long to import grpc
    deadline = time.monotonic() + START_S
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1:
                    return proc
            except grpc.RpcError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                what = "the rls service" if settings is not None else f"the empty {floor} server"
                raise SystemExit(f"{what} did not answer its health check in {START_S} s")
            time.sleep(0.05)


class Server:
    """A gRPC server under test: its port and process, and how to ask it how many calls
    it answered, by code (``ok``, ``over_limit``, ``invalid_argument``, ``error``)."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, metrics_port: int | None) -> None:
        self.proc, self.port, self.metrics_port = proc, port, metrics_port

    def answered(self) -> dict[str, int]:
        """Calls answered so far, by code: the service's metrics, or the floor's count."""
        if self.metrics_port is None:
            with grpc.insecure_channel(f"127.0.0.1:{self.port}") as channel:
                stub = rls_pb2_grpc.RateLimitServiceStub(channel)
                reply = stub.ShouldRateLimit(rls_pb2.RateLimitRequest(domain=COUNT_DOMAIN))
            return {"ok": reply.statuses[0].limit_remaining}
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as got:
            text = got.read().decode()
        counts = dict.fromkeys(("ok", "over_limit", "invalid_argument", "error"), 0)
        for found in re.finditer(
            r'^gateway_limiter_rls_requests_total\{code="(\w+)"\} ([0-9.e+]+)$', text, re.M
        ):
            counts[found.group(1)] = int(float(found.group(2)))
        return counts

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)


#: The h2load rows' answer checks: (answered by the server as counted by the server's
#: own metrics or count, of which refused, and h2load's count of answers received).
Checked = tuple[int, int, int]


def h2load_row(
    server: Server,
    connections: int,
    body: bytes,
    args: argparse.Namespace,
    in_flight: int | None = None,
) -> tuple[Result, Checked, float]:
    """``h2load`` sending ``body`` (a length-prefixed RateLimitRequest) as gRPC unary
    calls over h2c: ``--in-flight`` streams in all over ``connections`` connections, a
    warm-up run, then a timed one. The result, the checks, and h2load's own CPU per
    call (µs)."""
    streams = max(1, (in_flight or args.in_flight) // connections)
    with tempfile.TemporaryDirectory(prefix="gwl-bench-h2load-") as workdir:
        body_file, log_file = Path(workdir) / "body", Path(workdir) / "log"
        body_file.write_bytes(body)
        base = [
            *(args.h2load, "-d", str(body_file), "-c", str(connections)),
            *("-m", str(streams), "-t", "1"),
            *("-H", "content-type: application/grpc", "-H", "te: trailers"),
        ]
        url = f"http://127.0.0.1:{server.port}/{SERVICE}/ShouldRateLimit"
        subprocess.run(
            [*base, "-D", f"{round(args.warmup * 1000)}ms", url], capture_output=True, check=True
        )
        before, cpu_before = server.answered(), cpu_seconds(server.proc.pid)
        client_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        ran = subprocess.run(
            [*base, "-D", f"{round(args.seconds * 1000)}ms", f"--log-file={log_file}", url],
            capture_output=True,
            text=True,
            check=True,
        )
        client_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_took = cpu_seconds(server.proc.pid) - cpu_before
        after = server.answered()
        lines = log_file.read_text().split()
    # each line: start (µs since the epoch), HTTP status, duration (µs)
    statuses, durations = lines[1::3], [int(x) / 1000 for x in lines[2::3]]
    done = sum(s == "200" for s in statuses)
    found = re.search(r"finished in ([0-9.]+)s", ran.stdout)
    took = float(found.group(1)) if found else args.seconds
    answered = {code: after.get(code, 0) - before.get(code, 0) for code in after}
    served = answered.get("ok", 0) + answered.get("over_limit", 0)
    if answered.get("error", 0) or answered.get("invalid_argument", 0) or done < len(statuses):
        raise SystemExit(f"h2load's calls were not all answered: {answered}; {ran.stdout}")
    # the server's count includes calls the client sent but stopped waiting for at the end
    if not done <= served <= done + connections * streams:
        raise SystemExit(f"the server answered {served} calls, h2load received {done}")
    client_cpu = sum(
        getattr(client_after, f) - getattr(client_before, f) for f in ("ru_utime", "ru_stime")
    )
    result = (
        done / took,
        percentile(durations, 0.5),
        percentile(durations, 0.99),
        answered.get("over_limit", 0),
        cpu_took / max(1, served) * 1e6,
    )
    return result, (served, answered.get("over_limit", 0), done), client_cpu / max(1, done) * 1e6


def framed(descriptors: int, urls: tuple[str, ...] = URLS, hits: int = 0) -> bytes:
    """A RateLimitRequest as one gRPC message: flag 0, its length (4 bytes, big-endian),
    the protobuf."""
    message = request(descriptors, urls, hits).SerializeToString()
    return b"\x00" + struct.pack(">I", len(message)) + bytes(message)


def one_call(port: int, body: bytes) -> tuple[int, Any]:
    """One call by ``nghttp`` (nghttp2-client, beside h2load): its ``grpc-status``
    trailer, and its answer (a RateLimitResponse) when the status is 0."""
    nghttp = shutil.which("nghttp")
    if nghttp is None:
        raise SystemExit("nghttp is not on PATH: apt-get install nghttp2-client")
    with tempfile.NamedTemporaryFile(prefix="gwl-bench-call-") as body_file:
        body_file.write(body)
        body_file.flush()
        call = [
            *(nghttp, "-d", body_file.name, "-H", "content-type: application/grpc"),
            *("-H", "te: trailers", f"http://127.0.0.1:{port}/{SERVICE}/ShouldRateLimit"),
        ]
        frames = subprocess.run([*call, "-v"], capture_output=True, check=True).stdout
        found = re.search(rb"grpc-status: ([0-9]+)", frames)
        status = -1 if found is None else int(found.group(1))
        if status != 0:
            return status, None
        data = subprocess.run(call, capture_output=True, check=True).stdout
    return 0, rls_pb2.RateLimitResponse.FromString(data[5:])


def checked_call(server: Server, body: bytes, code: int, what: str) -> str:
    """One call by nghttp whose grpc-status must be 0 and whose answer ``code``; up to
    ``ATTEMPTS`` calls, as a loaded host's Redis can miss its timeout and the service
    (``on_backend_error = "deny"``) then refuses, saying so."""
    if shutil.which("nghttp") is None:
        return f"{what}: not checked (nghttp is not on PATH)"
    name = rls_pb2.RateLimitResponse.Code.Name(code)
    said = ""
    for attempt in range(1, ATTEMPTS + 1):
        status, reply = one_call(server.port, body)
        if status == 0 and reply.overall_code == code:
            again = "" if attempt == 1 else f" (at call {attempt}; before: {said})"
            return f"{what}: grpc-status 0, {name}{again}"
        said = f"grpc-status {status}"
        if reply is not None:
            headers = {h.key: h.value for h in reply.response_headers_to_add}
            said += (
                f", {rls_pb2.RateLimitResponse.Code.Name(reply.overall_code)}, decided by "
                f"{headers.get('X-RateLimit-Decided-By', '?')}"
            )
        time.sleep(0.2)
    raise SystemExit(f"{what}: {said}, not grpc-status 0 and {name}, in {ATTEMPTS} calls")


#: Calls ``checked_call`` makes at most.
ATTEMPTS = 5


async def grpc_row(
    server: Server,
    connections: int,
    descriptors: int,
    args: argparse.Namespace,
    urls: tuple[str, ...] = URLS,
) -> Result:
    """A ``grpc.aio`` client in this process: ``--in-flight`` tasks calling in a loop
    over ``connections`` channels."""
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") for _ in range(connections)]
    stubs = [rls_pb2_grpc.RateLimitServiceStub(c) for c in channels]
    req = request(descriptors, urls)
    turn = 0

    async def call() -> bool:
        nonlocal turn
        turn += 1
        reply = await stubs[turn % connections].ShouldRateLimit(req, timeout=5)
        return bool(reply.overall_code == rls_pb2.RateLimitResponse.OK)

    try:
        return await measure(call, args.in_flight, args.warmup, args.seconds, server.proc.pid)
    finally:
        for channel in channels:
            await channel.close()


def server_row(
    server: Server,
    connections: int,
    descriptors: int,
    args: argparse.Namespace,
    urls: tuple[str, ...] = URLS,
    in_flight: int | None = None,
) -> tuple[Result, Checked | None, float]:
    """One row against ``server``: by h2load, or by the ``grpc.aio`` client."""
    if args.client == "h2load":
        return h2load_row(server, connections, framed(descriptors, urls), args, in_flight)
    if in_flight is not None:
        args = argparse.Namespace(**{**vars(args), "in_flight": in_flight})
    return asyncio.run(grpc_row(server, connections, descriptors, args, urls)), None, math.nan


async def in_process_row(
    limiter: AsyncGatewayLimiter,
    descriptors: int,
    args: argparse.Namespace,
    in_flight: int | None = None,
) -> Result:
    judge = Judge(limiter)
    wanted = [Wanted(url, None, 1) for url in URLS[:descriptors]]

    async def call() -> bool:
        return answer(limiter, await judge.judge("bench", wanted)).ok

    return await measure(call, in_flight or args.in_flight, args.warmup, args.seconds)


async def in_process_rows(
    args: argparse.Namespace, database_url: str, redis_url: str, prefix: str
) -> dict[str, Result]:
    """The same decisions in this process, no gRPC: 1 and 2 descriptors with
    ``--in-flight`` calls in flight, and 1 descriptor with one call in flight."""
    results = {}
    async with AsyncGatewayLimiter(
        database_url=database_url,
        redis_url=redis_url,
        key_prefix=prefix,
        reload_interval=3600,
        on_backend_error="deny",
    ) as limiter:
        for n in (1, 2):
            results[f"in-process, {n} descriptor(s)"] = await in_process_row(limiter, n, args)
        # one call at a time: every call its own Redis round trip
        alone = await in_process_row(limiter, 1, args, in_flight=1)
        results["in-process, 1 descriptor, 1 call in flight"] = alone
    return results


#: A row that refuses: the check that OVER_LIMIT is answered and counted.
CHECK_URL, CHECK_RATE = "/bench/rls/refusing", 100
CONNECTIONS = (1, 8)
#: The issue's target for one service process.
TARGET_RATE, TARGET_P99_MS = 5000, 5.0


def run(args: argparse.Namespace, database_url: str, redis_url: str) -> list[list[str]]:
    prefix = f"bench-rls-{uuid.uuid4().hex[:6]}"
    rows: list[list[str]] = []
    measured: dict[str, Result] = {}

    def row(
        what: str,
        connections: str,
        result: Result,
        checked: Checked | None = None,
        client_us: float = math.nan,
    ) -> None:
        measured[f"{what}, {connections}"] = result
        rate, p50, p99, refused, cpu_us = result
        rows.append(
            [
                what,
                connections,
                f"{rate:,.0f}",
                f"{p50:.2f}",
                f"{p99:.2f}",
                str(refused),
                f"{cpu_us:,.0f}",
                f"{1e6 / cpu_us:,.0f}" if cpu_us > 0 else "n/a",
                "n/a" if math.isnan(client_us) else f"{client_us:,.0f}",
                "n/a" if checked is None else f"{checked[0]:,}",
            ]
        )

    with tempfile.TemporaryDirectory(prefix="gwl-bench-rls-") as workdir:
        settings = Path(workdir) / "settings.toml"
        settings.write_text(
            f'database_url = "{database_url}"\nredis_url = "{redis_url}"\n'
            f'key_prefix = "{prefix}"\nreload_interval = 3600\non_backend_error = "deny"\n'
        )
        servers: list[tuple[str, Server, tuple[int, ...]]] = []
        try:
            for floor in ("aio", "sync"):
                port = free_port()
                servers.append(
                    (
                        f"empty {floor} server",
                        Server(start_service(None, port, floor=floor), port, None),
                        (1,),
                    )
                )
            port = free_port()
            metrics_port = free_port() if has_metrics() else None
            service = Server(start_service(settings, port, metrics_port), port, metrics_port)
            servers.append(("service", service, (1, 2)))
            ok = rls_pb2.RateLimitResponse.OK
            for name, server, _n in servers:
                CHECKS.append(checked_call(server, framed(1), ok, name))
            CHECKS.append(checked_call(service, framed(2), ok, "service, 2 descriptors"))
            for connections in CONNECTIONS:
                for name, server, descriptor_counts in servers:
                    for n in descriptor_counts:
                        what = name if name.startswith("empty") else f"service, {n} descriptor(s)"
                        row(what, str(connections), *server_row(server, connections, n, args))
            # one call at a time: the latency of a call that waits for no other
            alone = server_row(service, 1, 1, args, in_flight=1)
            row("service, 1 descriptor, 1 call in flight", "1", *alone)
            result, checked, client_us = server_row(service, CONNECTIONS[-1], 1, args, (CHECK_URL,))
            row(
                f"service, a row of {CHECK_RATE:,}/s",
                str(CONNECTIONS[-1]),
                result,
                checked,
                client_us,
            )
            over = rls_pb2.RateLimitResponse.OVER_LIMIT
            # more permits than the row holds: refused whatever the bucket has refilled
            refusing = f"service, {CHECK_RATE * 10:,} permits of the row of {CHECK_RATE:,}/s"
            body = framed(1, (CHECK_URL,), CHECK_RATE * 10)
            CHECKS.append(checked_call(service, body, over, refusing))
        finally:
            for _name, server, _n in servers:
                server.stop()
    local = asyncio.run(in_process_rows(args, database_url, redis_url, prefix))
    for what, result in local.items():
        row(what, "-", result)
    summary(args, measured)
    return rows


def has_metrics() -> bool:
    """prometheus-client is installed: the service counts its answers by code."""
    return importlib.util.find_spec("prometheus_client") is not None


SUMMARY: list[str] = []
#: One call to each server by nghttp, its trailer and answer checked.
CHECKS: list[str] = []


def summary(args: argparse.Namespace, measured: dict[str, Result]) -> None:
    """The lines printed under the table: the gRPC layer's cost as ratios, the target,
    the refusing row's check."""
    SUMMARY.clear()
    local = measured["in-process, 1 descriptor(s), -"]
    for c in CONNECTIONS:
        service, empty = (
            measured[f"service, 1 descriptor(s), {c}"],
            measured[f"empty aio server, {c}"],
        )
        SUMMARY.append(
            f"{c} connection(s), 1 descriptor: service / in-process: calls/s "
            f"{service[0] / local[0]:.2f}, CPU per call {service[4] / local[4]:.1f}x; "
            f"empty grpc.aio server / service: CPU per call {empty[4] / service[4]:.2f} "
            f"(the gRPC layer's share of the service's CPU)"
        )
    best = max(
        (r for k, r in measured.items() if k.startswith("service, 1 descriptor")),
        key=lambda r: r[0],
    )
    empty_best = max(
        (r for k, r in measured.items() if k.startswith("empty aio")), key=lambda r: r[0]
    )
    met = best[0] >= TARGET_RATE and best[2] < TARGET_P99_MS
    SUMMARY.append(
        f"target {TARGET_RATE:,} calls/s with p99 < {TARGET_P99_MS:g} ms per service "
        f"process: best service row {best[0]:,.0f} calls/s, p99 {best[2]:.2f} ms: "
        f"{'met' if met else 'NOT met'}; the empty grpc.aio server's best: "
        f"{empty_best[0]:,.0f} calls/s, {empty_best[4]:,.0f} µs CPU per call "
        f"({1e6 / empty_best[4]:,.0f} per core)"
    )
    SUMMARY.append(
        f"cores (one service process each) for {TARGET_RATE:,} calls/s at the service's "
        f"CPU per call: {math.ceil(TARGET_RATE * best[4] / 1e6)}"
    )
    alone = measured["service, 1 descriptor, 1 call in flight, 1"]
    SUMMARY.append(
        f"one call in flight: the service answers {alone[0]:,.0f} calls/s, p50 "
        f"{alone[1]:.2f} ms, p99 {alone[2]:.2f} ms"
    )
    refusing = measured[f"service, a row of {CHECK_RATE:,}/s, {CONNECTIONS[-1]}"]
    admitted = refusing[0] - refusing[3] / args.seconds
    SUMMARY.append(
        f"a row of {CHECK_RATE:,}/s through the service: {refusing[0]:,.0f} calls/s, "
        f"{admitted:,.0f}/s answered OK, {refusing[3]:,} OVER_LIMIT (counted by the service)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--seconds", type=positive_float, default=3.0, help="per row (3)")
    parser.add_argument("--warmup", type=positive_float, default=0.5, help="per row (0.5)")
    parser.add_argument(
        "--in-flight", type=positive_int, default=16, help="calls in flight at once (16)"
    )
    parser.add_argument(
        "--client",
        choices=("h2load", "grpcio"),
        default="h2load",
        help="h2load (nghttp2-client; default), or a grpc.aio client in this process",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 0.3 s per row")
    parser.add_argument("--serve-aio", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--serve-sync", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_aio is not None:
        asyncio.run(serve_floor(args.serve_aio))
        return
    if args.serve_sync is not None:
        serve_sync_floor(args.serve_sync)
        return
    if args.quick:
        args.seconds, args.warmup = 0.3, 0.1
    args.h2load = shutil.which("h2load")
    if args.client == "h2load" and (args.h2load is None or shutil.which("nghttp") is None):
        raise SystemExit(
            "h2load or nghttp is not on PATH: apt-get install nghttp2-client (or --client grpcio)"
        )
    with ExitStack() as stack:
        rows_of: dict[str, dict[str, Any]] = {
            url: {"rate_limit": OPEN_RATE, "cache": 0.0} for url in URLS
        }
        rows_of[CHECK_URL] = {"rate_limit": CHECK_RATE, "cache": 0.0}
        database_url = sqlite_table(stack, rows_of)
        redis_url = stack.enter_context(private_redis())
        client = redis.Redis.from_url(redis_url)
        for line in machine_facts(client, redis_url, True, peers=False, metrics=False):
            print(line)
        print(
            f"grpc:     grpcio {version('grpcio')}, xds-protos {version('xds-protos')}; the "
            f"service records its metrics (prometheus-client {version('prometheus-client')})"
        )
        if args.client == "h2load":
            h2 = subprocess.run(
                [args.h2load, "--version"], capture_output=True, text=True, check=True
            )
            print(f"client:   {h2.stdout.strip()}, one thread, gRPC unary calls over h2c")
        else:
            print("client:   grpc.aio in this process")
        print(f"load:     {load_average()} (before the run)")
        print(f"in flight: {args.in_flight}; {args.seconds:g} s per row after {args.warmup:g} s")
        rows = run(args, database_url, redis_url)
        print("\nShouldRateLimit: calls/s and latency (ms), service and client on this machine")
        print(
            "(CPU: the answering process's user + system time per call: the server's for "
            "the gRPC rows, this process's in-process; per core: 1 s / that; client: "
            "h2load's CPU per call; answered: calls the server counted, every one OK or "
            "OVER_LIMIT)"
        )
        headers = [
            *("how", "conns", "calls/s", "p50 ms", "p99 ms", "refused"),
            *("CPU µs/call", "per core/s", "client µs/call", "answered"),
        ]
        print(table(headers, rows, left=2))
        print("\nOne call by nghttp to each server, its grpc-status trailer and answer:")
        for line in CHECKS:
            print(f"  {line}")
        print("\ngRPC layer:")
        for line in SUMMARY:
            print(f"  {line}")


if __name__ == "__main__":
    main()
