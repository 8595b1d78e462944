"""Jobs for an RQ worker pool: each worker process decides with one limiter of its own.

    rq worker-pool -n 4 -w rq.worker.SimpleWorker -u redis://127.0.0.1:6379/0 supplier

and, wherever jobs are queued::

    from redis import Redis
    from rq import Queue
    Queue("supplier", connection=Redis()).enqueue("rq_jobs.call_supplier", "/ibe/flight/search")

``SimpleWorker`` runs each job in the worker process itself, so the process-wide
limiter (``gateway_limiter.decide``: built and started on first use, from
``settings.toml`` or ``GATEWAY_LIMITER_*``) lives as long as the worker and decides
every job it takes, with one fleet member per worker. RQ's default ``Worker`` forks a
new process for every job instead: the limiter would start (or, started in the
worker, restart: gateway_limiter/lifecycle.py) once per job, a reload and a heartbeat
for each, and its membership would linger after each job for its time to live.
"""

from __future__ import annotations

import os
from typing import Any

import gateway_limiter


def call_supplier(url: str) -> dict[str, Any]:
    """One job: decide without waiting; a refused job can be retried later."""
    decision = gateway_limiter.decide(url, timeout=0)
    # ... call the supplier when decision.allowed ...
    return {"pid": os.getpid(), "url": url, "allowed": decision.allowed, "limit": decision.limit}
