"""The gRPC server: ``envoy.service.ratelimit.v3.RateLimitService`` and the standard
health service (``grpc.health.v1.Health``) on ``grpc.aio``, over one
``AsyncGatewayLimiter``.

``RlsServer`` serves until ``stop``: it starts the limiter (the table, Redis, the
fleet), listens, and says SERVING; ``stop`` says NOT_SERVING, lets the calls in flight
finish (``grace_s``), then closes the limiter. ``run_rls`` is what ``gateway-limiter
rls`` runs: the same, until SIGTERM or Ctrl-C.

Metrics (with prometheus-client, beside the limiter's own, on ``--metrics-port``):

================================================ ========= ================================
``gateway_limiter_rls_requests_total``           counter   requests, by ``code`` (ok,
                                                           over_limit, invalid_argument,
                                                           cancelled: the caller went
                                                           away or its deadline passed,
                                                           error)
``gateway_limiter_rls_request_seconds``          histogram time to answer a request
``gateway_limiter_rls_errors_total``             counter   requests that failed (a bug or
                                                           an error the limiter raised)
================================================ ========= ================================
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import time
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.config.settings import Settings
from gateway_limiter.observe.logs import log
from gateway_limiter.rls.answers import Answer, answer
from gateway_limiter.rls.descriptors import BadRequest, read_request
from gateway_limiter.rls.judge import Judge

try:
    import prometheus_client
except ImportError:  # pragma: no cover - the metrics are optional
    prometheus_client = None  # type: ignore[assignment]

#: The service's full name, as Envoy and the health service name it.
SERVICE = "envoy.service.ratelimit.v3.RateLimitService"
DEFAULT_LISTEN = "127.0.0.1:8081"
#: Seconds the calls in flight get to finish on SIGTERM.
GRACE_S = 5.0

_OK = rls_pb2.RateLimitResponse.OK
_OVER = rls_pb2.RateLimitResponse.OVER_LIMIT


class RlsMetrics:
    """The service's own metrics (the module's table), in the default registry once."""

    _made: RlsMetrics | None = None

    def __init__(self) -> None:
        assert prometheus_client is not None
        self.requests = prometheus_client.Counter(
            "gateway_limiter_rls_requests", "rate limit requests answered, by code", ["code"]
        )
        self.seconds = prometheus_client.Histogram(
            "gateway_limiter_rls_request_seconds",
            "seconds to answer a rate limit request",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
        )
        self.errors = prometheus_client.Counter(
            "gateway_limiter_rls_errors", "rate limit requests that failed"
        )
        #: code -> its child of ``requests``, looked up once rather than per request
        self.by_code = {
            code: self.requests.labels(code)
            for code in ("ok", "over_limit", "invalid_argument", "cancelled", "error")
        }

    @classmethod
    def get(cls) -> RlsMetrics | None:
        """The process's metrics, or None without prometheus-client."""
        if prometheus_client is None:
            return None
        if cls._made is None:
            cls._made = RlsMetrics()
        return cls._made


def to_proto(done: Answer) -> rls_pb2.RateLimitResponse:
    """``done`` as Envoy's RateLimitResponse."""
    response = rls_pb2.RateLimitResponse(overall_code=_OK if done.ok else _OVER)
    for status in done.statuses:
        out = response.statuses.add(code=_OK if status.ok else _OVER)
        if status.limit is not None:
            out.current_limit.requests_per_unit = status.limit.requests_per_unit
            out.current_limit.unit = status.limit.unit
            out.current_limit.name = status.limit.name
            out.limit_remaining = min(status.remaining, 2**32 - 1)
        if status.reset_s is not None:
            out.duration_until_reset.FromNanoseconds(round(status.reset_s * 1e9))
    for name, value in done.headers.items():
        response.response_headers_to_add.append(base_pb2.HeaderValue(key=name, value=value))
    return response


class RateLimitService(rls_pb2_grpc.RateLimitServiceServicer):  # type: ignore[misc]
    """``ShouldRateLimit`` answered from ``limiter`` (started)."""

    def __init__(self, limiter: AsyncGatewayLimiter, metrics: RlsMetrics | None) -> None:
        self.limiter = limiter
        self.judge = Judge(limiter, limiter.settings.rls_domain_channel)
        self.metrics = metrics

    async def ShouldRateLimit(
        self, request: rls_pb2.RateLimitRequest, context: grpc.aio.ServicerContext
    ) -> rls_pb2.RateLimitResponse:
        """Decide every descriptor of ``request`` together (``judge.py``)."""
        began = time.perf_counter()
        code: str | None = "error"  # None: counted already
        try:
            try:
                wanted = read_request(
                    self.limiter.settings,
                    request.domain,
                    [
                        (
                            [(e.key, e.value) for e in d.entries],
                            d.hits_addend.value if d.HasField("hits_addend") else None,
                        )
                        for d in request.descriptors
                    ],
                    request.hits_addend,
                )
            except BadRequest as e:
                # counted before the answer goes: abort sends it at once
                self._count("invalid_argument", began)
                code = None
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            judgement = await self.judge.judge(request.domain, wanted)
            response = to_proto(answer(self.limiter, judgement))
            code = "ok" if judgement.allowed else "over_limit"
            return response
        except asyncio.CancelledError:
            # the caller went away (Envoy's timeout passed, or it closed the stream):
            # nothing failed here
            code = "cancelled"
            raise
        except Exception:
            if code == "error":
                log.exception("rate limit request failed")
                if self.metrics is not None:
                    self.metrics.errors.inc()
            raise
        finally:
            if code is not None:
                self._count(code, began)

    def _count(self, code: str, began: float) -> None:
        """One request answered with ``code``, ``began`` (perf_counter) ago."""
        if self.metrics is not None:
            self.metrics.by_code[code].inc()
            self.metrics.seconds.observe(time.perf_counter() - began)


class RlsServer:
    """The service on ``listen`` (``host:port``; port 0: a free one, see ``port``)."""

    def __init__(self, settings: Settings, listen: str = DEFAULT_LISTEN) -> None:
        self.settings = settings
        self.listen = listen
        self.limiter = AsyncGatewayLimiter(settings)
        self.health = health_aio.HealthServicer()
        self.server: Any = None
        self.port = 0

    async def start(self) -> RlsServer:
        """Start the limiter, listen, say SERVING. OSError when ``listen`` cannot be bound."""
        await self.limiter.start()
        server = grpc.aio.server(
            options=[("grpc.so_reuseport", 0), ("grpc.max_concurrent_streams", 1000)]
        )
        metrics = RlsMetrics.get() if self.settings.metrics else None
        rls_pb2_grpc.add_RateLimitServiceServicer_to_server(
            RateLimitService(self.limiter, metrics), server
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        try:
            self.port = server.add_insecure_port(self.listen)
        except RuntimeError as e:
            await self.limiter.aclose()
            raise OSError(f"cannot listen on {self.listen}: {e}") from None
        if self.port == 0:
            await self.limiter.aclose()
            raise OSError(f"cannot listen on {self.listen}")
        await server.start()
        self.server = server
        for name in ("", SERVICE):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        return self

    async def stop(self, grace_s: float = GRACE_S) -> None:
        """NOT_SERVING, the calls in flight finish (at most ``grace_s``), then the
        limiter closes."""
        await self.health.enter_graceful_shutdown()
        if self.server is not None:
            await self.server.stop(grace_s)
        await self.limiter.aclose()


async def serve_until_signalled(
    settings: Settings, listen: str, ready: Any = None, metrics_port: int | None = None
) -> None:
    """Serve until SIGTERM or SIGINT, then stop gracefully. ``ready(server)`` is called
    once listening."""
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    server = await RlsServer(settings, listen).start()
    # Everything made so far (modules, the table, grpc's and protobuf's objects) lives as
    # long as the process: out of the collector's sight, so that the full collections
    # that many small answers set off scan only what the calls made (bench/rls.py: the
    # collector took about a seventh of the service's event loop without this).
    gc.freeze()
    exporter = None
    try:
        if metrics_port is not None:
            from gateway_limiter.observe.metrics import serve

            exporter = serve(metrics_port, listen.rsplit(":", 1)[0].strip("[]") or "127.0.0.1")
        if ready is not None:
            ready(server)
        await stopping.wait()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        if exporter is not None:
            exporter.close()
        with contextlib.suppress(Exception):
            await server.stop()
