"""Slots across a failover: a limiter's slots taken on the Redis that holds them now,
and a waiter of its own handed the slot a holder gives back."""

from __future__ import annotations

import threading
import time
from typing import Any

from gateway_limiter import GatewayLimiter
from gateway_limiter.backends.slots import slot_keys
from tests.support.clusters import wait_for


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
