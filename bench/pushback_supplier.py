#!/usr/bin/env python
"""Pushback end to end: gateway processes calling a supplier that takes less than the row.

Real processes on loopback: one supplier (an HTTP server that takes
``--supplier-rate`` calls a second and answers 429 without ``Retry-After`` above it:
``--supplier bucket``, the default, a token bucket of ``--supplier-burst`` (5), the
supplier ``bench/pushback_constants.py`` chose the constants against; ``--supplier
window``, at most that many calls in any one second, a sliding window), ``--processes``
gateway processes of ``--threads`` threads, each calling the supplier as fast as it
lets them through ``httpx`` and ``gateway_limiter.integrations.httpx.LimiterTransport``
(a refused call pauses ``--pause`` s, as a gateway's own caller would go away), a row
of ``--row-rate`` a second with a wait budget of ``--cache`` s, one Redis and one
limits table.

It prints, per second, what the gateways asked (calls), what the limiter refused
before the supplier, and what reached the supplier and how it answered; then, from
``--from-s`` on, the share of the calls reaching the supplier that succeeded and the
successes per second over the supplier's rate, against pushback's targets
(>= 90 %, >= 0.8).

``--retry-after-at S``: the other experiment. The supplier takes everything, except
that the first call after S seconds gets one 429 with ``Retry-After: 2``; the report
says when calls reached the supplier around it (none should for 2 s, within a round
trip, and then traffic resumes). Use ``--cache 0`` there: a caller already granted a
permit with a wait before the 429 still goes when its wait ends.

    .venv/bin/python bench/pushback_supplier.py                 # 3 x 3, 16 s
    .venv/bin/python bench/pushback_supplier.py --plot          # and docs/pushback.png
    .venv/bin/python bench/pushback_supplier.py --retry-after-at 5 --seconds 10 --cache 0

A private redis-server and a SQLite limits table are made for the run unless
``--redis-url``/``--database-url`` say otherwise. ``--json PATH`` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import deque
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness.args import description, positive_float, positive_int
from bench.harness.limiters import sqlite_table, write_rows
from bench.harness.servers import die_with_parent, private_redis

URL = "/supplier/search"
DOCS = Path(__file__).resolve().parents[1] / "docs"


# --- the supplier process -------------------------------------------------------------


def serve_supplier(kind: str, rate: float, burst: float, retry_after_at: float | None) -> None:
    """Serve until stdin closes: 200 within ``rate``/s (``kind`` "bucket": a token bucket
    of ``burst``; "window": at most ``rate`` calls in any second), else 429;
    or, with ``retry_after_at``, 200 always but one 429 with Retry-After: 2 at the first
    call that many seconds after the start (the time read from stdin's first line).
    ``GET /_log`` answers every call seen as JSON [[arrival, status], ...]."""
    lock = threading.Lock()
    log: list[tuple[float, int]] = []
    bucket = {"tokens": burst, "at": time.time(), "start": 0.0, "pushed": 0.0}
    taken: deque[float] = deque()  # "window": the 200s of the last second

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            if self.path == "/_log":
                with lock:
                    self.answer(200, json.dumps(log).encode(), {})
                return
            headers: dict[str, str] = {}
            with lock:
                now = time.time()
                if retry_after_at is not None:
                    due = bucket["start"] and now >= bucket["start"] + retry_after_at
                    if due and not bucket["pushed"]:
                        bucket["pushed"] = now
                        status, headers = 429, {"Retry-After": "2"}
                    else:
                        status = 200
                elif kind == "window":
                    while taken and taken[0] <= now - 1.0:
                        taken.popleft()
                    status = 200 if len(taken) < rate else 429
                    if status == 200:
                        taken.append(now)
                else:
                    tokens = min(burst, bucket["tokens"] + (now - bucket["at"]) * rate)
                    status = 200 if tokens >= 1.0 else 429
                    bucket["tokens"], bucket["at"] = tokens - (status == 200), now
                log.append((now, status))
            self.answer(status, b"ok\n" if status == 200 else b"slow down\n", headers)

        def answer(self, status: int, body: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(server.server_address[1], flush=True)
    bucket["start"] = float(sys.stdin.readline())
    sys.stdin.read()  # until the run closes stdin (or dies: then stdin closes too)
    server.shutdown()


# --- a gateway process ----------------------------------------------------------------


def run_gateway(config: dict[str, Any]) -> None:
    """Start a limiter, say ready, wait for the start time on stdin, call for
    ``seconds``; print [[start, end, outcome], ...] (outcome: a status, or "refused")."""
    import httpx

    from gateway_limiter import GatewayLimiter, Refused
    from gateway_limiter.integrations.httpx import LimiterTransport

    limiter = GatewayLimiter(
        database_url=config["database_url"],
        redis_url=config["redis_url"],
        key_prefix=config["key_prefix"],
        reload_interval=3600,
        redis_timeout=2.0,  # a loaded box can miss the default 50 ms
    )
    limiter.start()
    transport = LimiterTransport(limiter)
    calls: list[tuple[float, float, int | str]] = []
    lock = threading.Lock()
    with httpx.Client(transport=transport, timeout=10.0) as client:
        print("ready", flush=True)
        start = float(sys.stdin.readline())
        end = start + config["seconds"]

        def caller() -> None:
            mine: list[tuple[float, float, int | str]] = []
            time.sleep(max(0.0, start - time.time()))
            while (began := time.time()) < end:
                try:
                    outcome: int | str = client.get(config["url"]).status_code
                except Refused:
                    outcome = "refused"
                mine.append((began, time.time(), outcome))
                if outcome == "refused":
                    time.sleep(config["pause"])
            with lock:
                calls.extend(mine)

        threads = [threading.Thread(target=caller) for _ in range(config["threads"])]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    limiter.close()
    print(json.dumps(calls), flush=True)


# --- the run ----------------------------------------------------------------------------


def spawn(*args: str) -> subprocess.Popen[str]:
    """This script in another role, talking over stdin/stdout."""
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=die_with_parent if sys.platform == "linux" else None,  # noqa: PLW1509
    )


def line_of(proc: subprocess.Popen[str], what: str) -> str:
    """The next line ``proc`` prints; SystemExit naming ``what`` if it died instead."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"the {what} exited ({proc.wait()}) before it was ready")
    return line.strip()


def measure(args: argparse.Namespace, database_url: str, redis_url: str) -> dict[str, Any]:
    """One run: the supplier's log and every gateway call, as times from the start."""
    supplier_args = ["--role", "supplier", "--supplier-rate", str(args.supplier_rate)]
    supplier_args += ["--supplier", args.supplier, "--supplier-burst", str(args.supplier_burst)]
    if args.retry_after_at is not None:
        supplier_args += ["--retry-after-at", str(args.retry_after_at)]
    procs: list[subprocess.Popen[str]] = []
    try:
        supplier = spawn(*supplier_args)
        procs.append(supplier)
        port = int(line_of(supplier, "supplier"))
        config = {
            "database_url": database_url,
            "redis_url": redis_url,
            "key_prefix": f"gwlpush{uuid.uuid4().hex[:8]}",
            "url": f"http://127.0.0.1:{port}{URL}",
            "seconds": args.seconds,
            "threads": args.threads,
            "pause": args.pause,
        }
        gateways = [spawn("--role", "gateway", json.dumps(config)) for _ in range(args.processes)]
        procs += gateways
        for g in gateways:
            if line_of(g, "gateway") != "ready":
                raise SystemExit("a gateway said something other than 'ready'")
        start = time.time() + 0.5
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(f"{start}\n")
            p.stdin.flush()
        calls = [json.loads(line_of(g, "gateway")) for g in gateways]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_log", timeout=30) as answer:
            log = json.loads(answer.read())
    finally:
        for p in procs:
            if p.stdin is not None:
                p.stdin.close()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    return {
        "supplier": [(at - start, status) for at, status in log],
        "calls": [(b - start, e - start, o) for per in calls for b, e, o in per],
    }


def per_second(run: dict[str, Any], seconds: float) -> list[dict[str, int]]:
    """Per whole second of the run: calls asked, refused by the limiter, and what the
    supplier saw (sent, 200, 429)."""
    rows = [
        dict.fromkeys(("calls", "refused", "sent", "ok", "429"), 0) for _ in range(int(seconds))
    ]
    for began, _end, outcome in run["calls"]:
        if 0 <= began < len(rows):
            rows[int(began)]["calls"] += 1
            rows[int(began)]["refused"] += outcome == "refused"
    for at, status in run["supplier"]:
        if 0 <= at < len(rows):
            row = rows[int(at)]
            row["sent"] += 1
            row["ok" if status == 200 else "429"] += 1
    return rows


def summary(args: argparse.Namespace, run: dict[str, Any]) -> dict[str, Any]:
    """The figures the targets are about, from ``--from-s`` to the end."""
    window = [(at, s) for at, s in run["supplier"] if args.from_s <= at < args.seconds]
    ok = sum(1 for _, s in window if s == 200)
    figures: dict[str, Any] = {
        "sent": len(window),
        "ok": ok,
        "success_share": ok / max(1, len(window)),
        "successes_per_s": ok / (args.seconds - args.from_s),
    }
    figures["of_supplier_rate"] = figures["successes_per_s"] / args.supplier_rate
    if args.retry_after_at is not None:
        pushed = [at for at, s in run["supplier"] if s == 429]
        if pushed:
            t = pushed[0]
            after = sorted(at - t for at, _ in run["supplier"] if at > t)
            figures["pushed_at"] = t
            figures["arrivals_after_429"] = after
            held = [a for a in after if a < 2.0]
            figures["last_arrival_in_hold"] = held[-1] if held else None
            figures["first_arrival_after_hold"] = next((a for a in after if a >= 2.0), None)
    return figures


def report(args: argparse.Namespace, run: dict[str, Any], figures: dict[str, Any]) -> None:
    """Print the per-second table and the figures."""
    print(
        f"{args.processes} processes x {args.threads} threads, row {args.row_rate}/s, "
        f"cache {args.cache} s, supplier {args.supplier_rate:g}/s ("
        + (f"bucket of {args.supplier_burst:g})" if args.supplier == "bucket" else "window)")
    )
    print(f"{'second':>6}  {'calls':>6}  {'refused':>7}  {'sent':>5}  {'200':>5}  {'429':>5}")
    for i, row in enumerate(per_second(run, args.seconds)):
        print(
            f"{i:>6}  {row['calls']:>6}  {row['refused']:>7}  {row['sent']:>5}  "
            f"{row['ok']:>5}  {row['429']:>5}"
        )
    print(
        f"from {args.from_s:g} s: {figures['sent']} calls reached the supplier, "
        f"{figures['success_share']:.1%} succeeded; {figures['successes_per_s']:.1f} "
        f"successes/s = {figures['of_supplier_rate']:.2f} x the supplier's rate "
        "(targets: >= 90 %, >= 0.80)"
    )
    if args.retry_after_at is not None:
        if "pushed_at" not in figures:
            print("the supplier never answered its 429 (no call after --retry-after-at?)")
            return
        last, first = figures["last_arrival_in_hold"], figures["first_arrival_after_hold"]
        held = sum(a < 2.0 for a in figures["arrivals_after_429"])
        print(
            f"429 with Retry-After: 2 at {figures['pushed_at']:.3f} s; calls that reached "
            f"the supplier within the next 2 s: {held}"
            + ("" if last is None else f" (the last at +{last:.3f} s)")
            + ("" if first is None else f"; first call after them: +{first:.3f} s")
        )


def plot(args: argparse.Namespace, run: dict[str, Any], path: Path) -> None:
    """Per second: successes, 429s and the limiter's refusals, with the two rates."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = per_second(run, args.seconds)
    xs = list(range(len(rows)))
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(xs, [r["ok"] for r in rows], marker="o", label="supplier: 200 per second")
    ax.plot(xs, [r["429"] for r in rows], marker="x", label="supplier: 429 per second")
    ax.plot(
        xs, [r["refused"] / 10 for r in rows], linestyle=":", label="refused by the limiter / 10"
    )
    ax.axhline(args.supplier_rate, color="grey", linestyle="--", label="supplier's rate")
    ax.axhline(args.row_rate, color="black", linestyle="-.", label="the row's rateLimit")
    ax.axvline(args.from_s, color="grey", linewidth=0.5)
    ax.set_xlabel("second of the run")
    ax.set_ylabel("calls per second")
    ax.set_title(
        f"pushback: {args.processes} gateway processes x {args.threads} threads, "
        f"supplier {args.supplier_rate:g}/s, row {args.row_rate}/s"
    )
    ax.legend(fontsize="small", loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description(__doc__))
    add = parser.add_argument
    add("--seconds", type=positive_float, default=16.0)
    add("--from-s", type=float, default=5.0, help="the figures count from this second on")
    add("--processes", type=positive_int, default=3)
    add("--threads", type=positive_int, default=3)
    add("--row-rate", type=positive_int, default=60)
    add("--cache", type=float, default=0.1, help="the row's wait budget (s)")
    add("--supplier", choices=["bucket", "window"], default="bucket")
    add("--supplier-rate", type=positive_float, default=30.0)
    add("--supplier-burst", type=positive_float, default=5.0, help="--supplier bucket's capacity")
    add("--pause", type=float, default=0.05, help="a refused caller's pause (s)")
    add("--retry-after-at", type=float, default=None)
    add("--redis-url", default=None)
    add("--database-url", default=None)
    add("--plot", action="store_true", help="write docs/pushback.png (the `plot` extra)")
    add("--plot-to", type=Path, default=DOCS / "pushback.png")
    add("--json", type=Path, default=None, help="write the figures and the run here")
    add("--role", choices=["run", "supplier", "gateway"], default="run", help=argparse.SUPPRESS)
    add("config", nargs="?", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = arguments(argv)
    if args.role == "supplier":
        serve_supplier(args.supplier, args.supplier_rate, args.supplier_burst, args.retry_after_at)
        return
    if args.role == "gateway":
        run_gateway(json.loads(args.config))
        return
    rows = {URL: {"rate_limit": args.row_rate, "cache": args.cache}}
    with ExitStack() as stack:
        redis_url = args.redis_url or stack.enter_context(private_redis())
        if args.database_url:
            write_rows(args.database_url, rows)
            database_url = args.database_url
        else:
            database_url = sqlite_table(stack, rows, prefix="gwl-bench-pushback-")
        run = measure(args, database_url, redis_url)
    figures = summary(args, run)
    report(args, run, figures)
    if args.plot:
        plot(args, run, args.plot_to)
    if args.json is not None:
        args.json.write_text(json.dumps({"figures": figures, "run": run}), encoding="utf-8")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
