#!/usr/bin/env python
"""ShouldRateLimit calls per second from a gRPC client against one `gateway-limiter rls`
process on one Redis, next to the same decisions made in-process; p50 and p99 latency.

Run from the checkout, with the venv's Python (extra ``rls``)::

    python bench/rls.py            # about 25 s
    python bench/rls.py --quick    # smoke run, a few seconds

One private ``redis-server`` and a SQLite table with two rows that never refuse (a rate
of 10,000,000/s). The service is the real command, ``python -m gateway_limiter rls``,
in a process of its own (metrics on, as shipped, when prometheus-client is installed).
The client is this process: ``--in-flight`` calls kept in flight at once (asyncio
tasks on ``grpc.aio``), over 1 and over 8 connections (channels); each call's
latency is timed from the client's send to its answer. In-process: the same requests
decided by ``Judge.judge`` and answered by ``answers.answer`` on an
``AsyncGatewayLimiter`` in this process, the same number in flight (and once with one
call in flight, so that each call makes its own Redis round trip): what the service
does less the gRPC layer (protobuf, HTTP/2, the server's and the client's event loops).
Each row also gives the CPU time (user + system) the deciding process spent per call
(the service's, or this process's in-process) and what one core would answer at that
cost: the figure a busy, shared host moves least. Each is measured with one
descriptor, and with two (two interfaces decided together in one ``descriptors.lua``
call). The floor: a gRPC server in a process of its own
whose ``ShouldRateLimit`` answers OK at once, asked the same way: what ``grpc.aio``
alone costs on this machine. The client shares the machine's cores with the
service and Redis, so the gRPC figures are what one client process gets; docs/envoy.md
has measured figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
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
ROOT = Path(__file__).resolve().parent.parent


def request(descriptors: int) -> Any:
    """A request naming the first ``descriptors`` interfaces."""
    return rls_pb2.RateLimitRequest(
        domain="bench",
        descriptors=[
            ratelimit_pb2.RateLimitDescriptor(
                entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key="interface", value=url)]
            )
            for url in URLS[:descriptors]
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


class Floor(rls_pb2_grpc.RateLimitServiceServicer):  # type: ignore[misc]
    """``ShouldRateLimit`` answering OK at once: the gRPC layer alone."""

    async def ShouldRateLimit(self, request: Any, context: Any) -> Any:
        return rls_pb2.RateLimitResponse(overall_code=rls_pb2.RateLimitResponse.OK)


async def serve_floor(port: int) -> None:
    """The floor's server, with the health service, until killed."""
    from grpc_health.v1.health import aio as health_aio

    server = grpc.aio.server()
    rls_pb2_grpc.add_RateLimitServiceServicer_to_server(Floor(), server)
    health = health_aio.HealthServicer()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def start_service(settings: Path | None, port: int) -> subprocess.Popen[bytes]:
    """``python -m gateway_limiter rls`` (no ``settings``: the floor's server), once it
    answers its health check."""
    if settings is None:
        command = [sys.executable, str(Path(__file__).resolve()), "--serve-floor", str(port)]
    else:
        command = [
            *(sys.executable, "-m", "gateway_limiter", "--settings", str(settings)),
            *("rls", "--listen", f"127.0.0.1:{port}"),
        ]
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "GATEWAY_LIMITER_SETTINGS": ""},
    )
    deadline = time.monotonic() + 30
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
                raise SystemExit("the rls service did not start")
            time.sleep(0.05)


async def grpc_row(
    port: int, pid: int, connections: int, descriptors: int, args: argparse.Namespace
) -> Result:
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}") for _ in range(connections)]
    stubs = [rls_pb2_grpc.RateLimitServiceStub(c) for c in channels]
    req = request(descriptors)
    turn = 0

    async def call() -> bool:
        nonlocal turn
        turn += 1
        reply = await stubs[turn % connections].ShouldRateLimit(req, timeout=5)
        return bool(reply.overall_code == rls_pb2.RateLimitResponse.OK)

    try:
        return await measure(call, args.in_flight, args.warmup, args.seconds, pid)
    finally:
        for channel in channels:
            await channel.close()


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


async def run(args: argparse.Namespace, database_url: str, redis_url: str) -> list[list[str]]:
    prefix = f"bench-rls-{uuid.uuid4().hex[:6]}"
    rows: list[list[str]] = []

    def row(what: str, result: Result) -> None:
        rate, p50, p99, refused, cpu_us = result
        rows.append(
            [
                what,
                f"{rate:,.0f}",
                f"{p50:.2f}",
                f"{p99:.2f}",
                str(refused),
                f"{cpu_us:,.0f}",
                f"{1e6 / cpu_us:,.0f}" if cpu_us > 0 else "n/a",
            ]
        )

    async with AsyncGatewayLimiter(
        database_url=database_url,
        redis_url=redis_url,
        key_prefix=prefix,
        reload_interval=3600,
        on_backend_error="deny",
    ) as limiter:
        for n in (1, 2):
            row(f"in-process, {n} descriptor(s)", await in_process_row(limiter, n, args))
        # one call at a time: every call its own Redis round trip, as calls that reach
        # the service one by one mostly make
        alone = await in_process_row(limiter, 1, args, in_flight=1)
        row("in-process, 1 descriptor, 1 call in flight", alone)
    with tempfile.TemporaryDirectory(prefix="gwl-bench-rls-") as workdir:
        settings = Path(workdir) / "settings.toml"
        settings.write_text(
            f'database_url = "{database_url}"\nredis_url = "{redis_url}"\n'
            f'key_prefix = "{prefix}"\nreload_interval = 3600\non_backend_error = "deny"\n'
        )
        port = free_port()
        service = start_service(settings, port)
        try:
            for n in (1, 2):
                for connections in (1, 8):
                    result = await grpc_row(port, service.pid, connections, n, args)
                    row(f"gRPC, {connections} connection(s), {n} descriptor(s)", result)
        finally:
            service.terminate()
            service.wait(20)
        port = free_port()
        floor = start_service(None, port)
        try:
            for connections in (1, 8):
                result = await grpc_row(port, floor.pid, connections, 1, args)
                row(f"floor: gRPC answering OK at once, {connections} connection(s)", result)
        finally:
            floor.terminate()
            floor.wait(20)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--seconds", type=positive_float, default=3.0, help="per row (3)")
    parser.add_argument("--warmup", type=positive_float, default=0.5, help="per row (0.5)")
    parser.add_argument(
        "--in-flight", type=positive_int, default=16, help="calls in flight at once (16)"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 0.3 s per row")
    parser.add_argument("--serve-floor", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_floor is not None:
        asyncio.run(serve_floor(args.serve_floor))
        return
    if args.quick:
        args.seconds, args.warmup = 0.3, 0.1
    with ExitStack() as stack:
        rows_of = {url: {"rate_limit": OPEN_RATE, "cache": 0.0} for url in URLS}
        database_url = sqlite_table(stack, rows_of)
        redis_url = stack.enter_context(private_redis())
        client = redis.Redis.from_url(redis_url)
        for line in machine_facts(client, redis_url, True, peers=False, metrics=False):
            print(line)
        print(
            f"grpc:     grpcio {version('grpcio')}, xds-protos {version('xds-protos')}; the "
            f"service records its metrics (prometheus-client {version('prometheus-client')})"
        )
        print(f"load:     {load_average()} (before the run)")
        print(f"in flight: {args.in_flight}; {args.seconds:g} s per row after {args.warmup:g} s")
        rows = asyncio.run(run(args, database_url, redis_url))
        print("\nShouldRateLimit: calls/s and latency (ms), service and client on this machine")
        print(
            "(CPU: the deciding process's user + system time per call: the service's for "
            "the gRPC rows, this process's in-process; per core: 1 s / that)"
        )
        headers = ["how", "calls/s", "p50 ms", "p99 ms", "refused", "CPU µs/call", "per core/s"]
        print(table(headers, rows))
        rate = {r[0]: float(r[1].replace(",", "")) for r in rows}
        grpc_best = max(v for k, v in rate.items() if k.startswith("gRPC") and "1 desc" in k)
        floor_best = max(v for k, v in rate.items() if k.startswith("floor"))
        local = rate["in-process, 1 descriptor(s)"]
        print(
            f"\ngRPC layer: best gRPC row / in-process (1 descriptor) = {grpc_best / local:.2f}; "
            f"best gRPC row / the floor's best = {grpc_best / floor_best:.2f}"
        )


if __name__ == "__main__":
    main()
