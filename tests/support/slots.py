"""Slots across a failover: a limiter's slots taken on the Redis that holds them now,
a waiter of its own handed the slot a holder gives back, and who hears the grants on a
Sentinel group's master."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from gateway_limiter import GatewayLimiter
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.backends.slots import channel, slot_keys
from tests.support.clusters import LocalSentinel, wait_for


def subscribers_on_master(group: LocalSentinel, prefix: str) -> int:
    """How many connections to the master the sentinels name now hear ``prefix``'s grants."""
    master = group.server_on(group.master_port()).client()
    return int(dict(master.pubsub_numsub(channel(prefix)))[channel(prefix).encode()])


def handed_over_after_recovery(
    lim: GatewayLimiter, url: str, prefix: str, client: Any, where: str
) -> None:
    """Wait until ``lim``'s slots of ``url`` are held in ``client``'s Redis (``where``,
    for the message), then: one holder, one waiter queued behind it, and the waiter
    handed the slot within 0.5 s of its release."""
    leases, queue = slot_keys(prefix, url)[:2]

    def held_there() -> bool:
        with lim.slot(url):
            return bool(client.zcard(leases) == 1)

    wait_for(f"slots taken {where}", held_there, 15)
    got: list[float] = []

    def second() -> None:
        with lim.slot(url, timeout=5.0):
            got.append(time.monotonic())

    with lim.slot(url):
        assert client.zcard(leases) == 1
        waiter = threading.Thread(target=second)
        waiter.start()
        wait_for("the waiter to queue", lambda: client.zcard(queue) == 1, 5)
        let_go = time.monotonic()
    waiter.join(10)
    assert len(got) == 1 and got[0] - let_go < 0.5


async def await_for(what: str, check: Callable[[], Any], seconds: float) -> None:
    """``wait_for`` for a coroutine: polls ``check`` (which may return an awaitable)
    without holding the event loop; RuntimeError naming ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            held = check()
            if inspect.isawaitable(held):
                held = await held
            if held:
                return
        except (redis.RedisError, OSError):
            pass
        await asyncio.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


async def handed_over_after_recovery_async(
    alim: AsyncGatewayLimiter, url: str, prefix: str, client: Any, where: str
) -> None:
    """``handed_over_after_recovery`` for an asyncio limiter: its waiter is a task."""
    leases, queue = slot_keys(prefix, url)[:2]

    async def held_there() -> bool:
        async with alim.slot(url):
            return bool(client.zcard(leases) == 1)

    await await_for(f"slots taken {where}", held_there, 15)
    got: list[float] = []

    async def second() -> None:
        async with alim.slot(url, timeout=5.0):
            got.append(time.monotonic())

    async with alim.slot(url):
        assert client.zcard(leases) == 1
        waiter = asyncio.create_task(second())
        await await_for("the waiter to queue", lambda: client.zcard(queue) == 1, 5)
        let_go = time.monotonic()
    await asyncio.wait_for(waiter, 10)
    assert len(got) == 1 and got[0] - let_go < 0.5
