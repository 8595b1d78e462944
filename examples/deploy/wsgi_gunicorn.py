"""A WSGI gateway under gunicorn: one limiter per worker process.

    gunicorn -w 4 wsgi_gunicorn:app                          # sync workers
    gunicorn -w 4 -k gthread --threads 8 wsgi_gunicorn:app   # threads
    gunicorn -w 4 --preload wsgi_gunicorn:app                # import once

The limiter is built and started when the module is imported: in each worker without
``--preload``, in the master with it. Either way works: a started limiter in a process
that forks is restarted in each worker (its own connections, reloads and fleet
membership), and the master, which only forks, leaves the fleet, so
``gateway-limiter fleet`` lists the workers. Settings come from ``settings.toml`` or
``GATEWAY_LIMITER_*`` variables (docs/design.md#settings).

Every path is an interface: ``GET /ibe/flight/search`` is decided as
``/ibe/flight/search`` without waiting; the answer says which process decided, and the
Decision's ``X-RateLimit-*`` headers go with it (429 with ``Retry-After`` when refused).
"""

from __future__ import annotations

import atexit
import json
import os
from collections.abc import Callable, Iterable
from typing import Any

from gateway_limiter import GatewayLimiter

limiter = GatewayLimiter.from_settings()
limiter.start()
# A worker that exits (gunicorn ends each with sys.exit) closes its limiter and leaves
# the fleet at once, rather than after its membership's time to live.
atexit.register(limiter.close)


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """Decide on the request's path, then answer (here: with what was decided)."""
    decision = limiter.decide(environ.get("PATH_INFO") or "/", timeout=0)
    body = json.dumps(
        {
            "pid": os.getpid(),
            "allowed": decision.allowed,
            "reason": decision.reason,
            "limit": decision.limit,
        }
    ).encode()
    status = "200 OK" if decision.allowed else "429 Too Many Requests"
    headers = [("Content-Type", "application/json"), *decision.headers().items()]
    start_response(status, headers)
    return [body]
