#!/usr/bin/env python
"""An asyncio gateway whose upstream HTTP calls are guarded by ``AsyncGatewayLimiter``.

Runs as written, with no servers and no network: the "supplier" is a tiny HTTP server
this script starts on a free local port, the limits live in a SQLite file in a
temporary folder (removed at the end), and the bucket is in-process (``memory://``).
Point ``database_url`` at MySQL and ``redis_url`` at Redis and the same code keeps a
whole fleet within the supplier's rate.

    python examples/aiohttp_or_httpx_guard.py

The upstream call is made with httpx when it is installed (``pip install httpx``), else
with a ten-line HTTP/1.1 client on ``asyncio.open_connection``; with aiohttp it would be
``async with session.get(url)``. The guard, ``await limiter.try_acquire(...)`` right
before the upstream call, is the same whatever the client.

What it shows: 60 requests arrive at once for an interface limited to 10 calls/s with a
wait budget (``cache``) of 1 s. The limiter lets 10 through at once (the permits a full
bucket has saved up), spaces the next 10 over the following second (one every 100 ms),
and refuses the other 40 at once, without waiting. The supplier sees the token-bucket
envelope and no more: the k-th call no sooner than (k - 10) / 10 s after the burst.
Then one request that must go through (``acquire``) waits for its turn.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from gateway_limiter import admin
from gateway_limiter.aio import AsyncGatewayLimiter

INTERFACE = "/ibe/flight/search"
RATE = 10  # calls per second the supplier's contract allows
BUDGET = 1.0  # seconds a request may wait for a permit (the row's cache)
REQUESTS = 60


# --- the supplier: a local HTTP server that remembers when each call arrived ----------


async def start_supplier(arrivals: list[float]) -> asyncio.Server:
    """An HTTP/1.1 server answering every request with a small JSON body."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.readline() not in (b"", b"\r\n"):
                pass  # skip the request line and headers
            arrivals.append(time.monotonic())
            body = b'{"flights": ["MU5101", "CA1501"]}'
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
            )
            await writer.drain()
        finally:
            writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0)


# --- the HTTP client: httpx if installed, else a minimal one ---------------------------


def http_get() -> tuple[str, Callable[[str], Awaitable[int]]]:
    """A name and an ``async get(url) -> status`` function."""
    try:
        import httpx  # type: ignore[import-not-found, unused-ignore]  # optional
    except ImportError:
        return "asyncio.open_connection", plain_get

    client = httpx.AsyncClient(timeout=5.0)

    async def get(url: str) -> int:
        return int((await client.get(url)).status_code)

    return f"httpx {httpx.__version__}", get


async def plain_get(url: str) -> int:
    """GET ``url`` (http://host:port/path) and return the status code."""
    host_port, _, path = url.removeprefix("http://").partition("/")
    host, _, port = host_port.partition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET /{path} HTTP/1.1\r\nHost: {host_port}\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    await reader.read()  # the rest of the response; the server closes
    writer.close()
    await writer.wait_closed()
    return status


# --- the gateway ---------------------------------------------------------------------


async def search_flights(
    limiter: AsyncGatewayLimiter, get: Callable[[str], Awaitable[int]], base: str
) -> str:
    """One gateway request: call the supplier only with a permit, else answer busy."""
    if not await limiter.try_acquire(INTERFACE):  # waits up to the row's cache, or refuses
        return "busy"  # or degrade: answer from a cache, queue the booking, ...
    status = await get(base + INTERFACE)
    return f"supplier {status}"


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="gateway-limiter-example-") as folder:
        # The limits table, as operations staff would fill it (``gateway-limiter db
        # upgrade`` and ``conf set`` do the same from the command line). Blocking
        # database I/O, done once before the gateway serves.
        database_url = f"sqlite:///{Path(folder) / 'limits.db'}"
        admin.upgrade(database_url)
        admin.set_limit(database_url, INTERFACE, rate=RATE, cache=BUDGET)
        await serve(database_url)


async def serve(database_url: str) -> None:
    """Start the supplier, send the burst through the limiter, then one ``acquire``."""
    arrivals: list[float] = []
    supplier = await start_supplier(arrivals)
    port = supplier.sockets[0].getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    client_name, get = http_get()
    print(f"supplier on {base}, limited to {RATE}/s; client: {client_name}")

    try:
        async with AsyncGatewayLimiter(database_url=database_url, redis_url="memory://") as limiter:
            started = time.monotonic()
            answers = await asyncio.gather(
                *(search_flights(limiter, get, base) for _ in range(REQUESTS))
            )
            took = time.monotonic() - started
            counted = collections.Counter(answers)
            print(f"{REQUESTS} requests at once -> {dict(counted)} in {took:.2f} s")

            offsets = sorted(t - started for t in arrivals)
            print("supplier saw calls at (s):", " ".join(f"{t:.1f}" for t in offsets))
            for k, t in enumerate(offsets, start=1):  # the k-th call: at least (k - C) / r in
                assert t >= (k - RATE) / RATE - 0.01, f"call {k} came {t:.3f} s in: too early"

            waited = await limiter.acquire(INTERFACE)  # must go through: waits its turn
            status = await get(base + INTERFACE)
            print(f"acquire waited {waited:.2f} s, then supplier answered {status}")
    finally:
        supplier.close()
        await supplier.wait_closed()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(main())
