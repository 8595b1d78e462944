"""``gateway-limiter serve-metrics``: Prometheus metrics of a limiter that follows the
table like a gateway, plus every bucket's live state, over HTTP."""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import suppress
from typing import TYPE_CHECKING

from gateway_limiter.cli.arguments import command, port_arg
from gateway_limiter.cli.context import (
    CliError,
    Context,
    database_problem,
    error_line,
    open_limiter,
    sigterm_interrupts,
)
from gateway_limiter.cli.describe import capacity
from gateway_limiter.observe.redact import mask_secrets

if TYPE_CHECKING:
    from gateway_limiter.limiter import GatewayLimiter
    from gateway_limiter.observe.metrics import BucketSample

#: ``serve-metrics`` listens here unless --port says otherwise.
METRICS_PORT = 9464


def register(parser: argparse.ArgumentParser) -> None:
    """Make ``parser`` the ``serve-metrics`` command."""
    command(parser, cmd_serve_metrics)
    parser.epilog = (
        "Needs prometheus-client: pip install 'gateway-limiter[metrics]'. Reloads the "
        "table like a gateway and reads every bucket in Redis at each scrape. A gateway "
        "process exposes its own decisions on prometheus_client's default registry, or "
        "with gateway_limiter.observe.metrics.serve(port)."
    )
    parser.add_argument(
        "--port",
        type=port_arg,
        default=METRICS_PORT,
        metavar="N",
        help=f"TCP port (default {METRICS_PORT}; 0: any free port, printed at start)",
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        metavar="ADDR",
        help="address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)",
    )


def cmd_serve_metrics(ctx: Context) -> int:
    """Serve the Prometheus metrics of a limiter that follows the table like a gateway,
    plus every bucket's live state, until Ctrl-C or SIGTERM."""
    from gateway_limiter.observe.metrics import MetricsUnavailable, Source, process_metrics, serve

    metrics = process_metrics()
    if metrics is None:
        raise CliError("prometheus-client is not installed: pip install 'gateway-limiter[metrics]'")
    a, out = ctx.args, ctx.out
    # The hot path's timeouts: a scrape must not hang on a dead Redis.
    limiter = open_limiter(ctx.settings.replace(metrics=True))
    source = Source(
        lambda: limiter.registry.snapshot,
        lambda: not limiter.backend_healthy,
        buckets=lambda: bucket_samples(limiter),
    )
    try:
        summary = limiter.start()
        if not summary.ok:
            error_line(
                database_problem(ctx.database, summary.error or "reload failed")
                + "; serving anyway (reloads are retried and counted)"
            )
        try:
            server = serve(a.port, a.host)
        except (OSError, MetricsUnavailable) as e:
            raise CliError(f"cannot serve metrics on {a.host}:{a.port}: {e}") from None
        metrics.attach(source)
        try:
            out.line(f"serving metrics on http://{a.host}:{server.port}/metrics; Ctrl-C to stop")
            if not limiter.backend.shared:
                out.line(
                    f"note: redis_url {mask_secrets(ctx.settings.redis_url)} keeps bucket "
                    "state inside each gateway process; the bucket gauges here show none"
                )
            sys.stdout.flush()
            with suppress(KeyboardInterrupt), sigterm_interrupts():
                while True:
                    time.sleep(3600)
        finally:
            metrics.detach(source)
            server.close()
    finally:
        limiter.close()
    return 0


def bucket_samples(limiter: GatewayLimiter) -> list[BucketSample]:
    """Every token/warm-up bucket's live state; stops at the first Redis error (one
    timeout per scrape at most, however many rules)."""
    from gateway_limiter.core.status import chosen_limits, describe_state, has_shared_bucket
    from gateway_limiter.observe.metrics import BucketSample

    samples = []
    seen: set[str] = set()
    for rule in chosen_limits(limiter.registry, None):
        # One sample per interface (its first shared bucket): the label is the URL.
        if rule.closed or not has_shared_bucket(rule) or rule.url in seen:
            continue
        seen.add(rule.url)
        status = describe_state(rule, limiter.backend)
        if status.error is not None:
            break
        stored = capacity(rule) if status.stored is None else status.stored
        free = None if status.next_free_ms is None else status.next_free_ms / 1000.0
        samples.append(BucketSample(rule.url, stored, status.debt_ms / 1000.0, free))
    return samples
