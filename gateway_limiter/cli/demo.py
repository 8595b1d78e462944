"""``gateway-limiter demo``: the limiter at work, live, with no servers at all.

Set-up: a temporary SQLite file migrated to the newest schema, four rows in
``t_ratelimite_conf`` (a limited interface, a slower one, a closed one, a disabled
one), and a ``GatewayLimiter`` on ``memory://`` that reloads the table every second.

Traffic: client threads ask each interface for more calls than its row allows. Shown,
per interface and second: the rule in force, the calls admitted (and how many of those
waited for a permit first, within the row's ``cache``) and the calls refused.

Midway, the demo changes a rate and flips the global switch off and on with plain SQL,
as an operator would. Each change is printed, and so is the moment the reload picked
it up, so the path from table to process shows within a second.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text
from sqlalchemy import Engine, text

from gateway_limiter.cli import arguments
from gateway_limiter.cli.console import load_console_serve
from gateway_limiter.cli.context import PROG, Context, open_limiter
from gateway_limiter.config.migrate import upgrade
from gateway_limiter.config.reload import Snapshot
from gateway_limiter.config.rules import Rule
from gateway_limiter.config.settings import Settings
from gateway_limiter.config.table import CONF_TABLE, SWITCH_TABLE, make_engine, upsert_conf
from gateway_limiter.limiter import GatewayLimiter
from gateway_limiter.model.bucket import US_PER_S
from gateway_limiter.observe.redact import mask_secrets

RELOAD_INTERVAL = 1.0
#: A second's counts are shown this long after it ends, so calls that were still
#: finishing their wait are in.
SETTLE = 0.1
#: How often the main loop looks for due changes, reloads and finished seconds.
TICK = 0.05


def register(parser: argparse.ArgumentParser) -> None:
    """Make ``parser`` the ``demo`` command."""
    arguments.command(parser, cmd_demo)
    parser.add_argument(
        "--seconds",
        type=arguments.seconds_arg,
        default=12,
        metavar="N",
        help="how long (default 12)",
    )
    parser.add_argument(
        "--console",
        action="store_true",
        help="also serve the operator console over the demo, on 127.0.0.1 (the console "
        "extra); give --seconds long enough to look around",
    )
    parser.add_argument(
        "--port",
        type=arguments.port_arg,
        default=8088,
        metavar="PORT",
        help="the console's port with --console (default 8088)",
    )


def cmd_demo(ctx: Context) -> int:
    """Run the self-contained demo (temporary SQLite + memory://, or --redis-url)."""
    return run_demo(
        ctx.args.seconds,
        console=ctx.out.console,
        # Only an explicit --redis-url: the demo never reads settings files or env.
        redis_url=ctx.args.redis_url or "memory://",
        web_port=ctx.args.port if ctx.args.console else None,
    )


@dataclass(frozen=True, slots=True)
class DemoInterface:
    """One row the demo creates, and the traffic it sends to that interface."""

    url: str
    rate: int
    cache: float
    enabled: bool
    demand: float  # calls per second asked for, over all of its threads
    threads: int


SEARCH = "/ibe/flight/search"
INTERFACES = (
    DemoInterface(SEARCH, rate=20, cache=0.2, enabled=True, demand=40, threads=4),
    DemoInterface("/ibe/booking/create", rate=5, cache=0.5, enabled=True, demand=10, threads=2),
    DemoInterface("/ibe/fare/quote", rate=0, cache=0.5, enabled=True, demand=6, threads=1),
    DemoInterface("/ibe/order/cancel", rate=2, cache=0.5, enabled=False, demand=4, threads=1),
)
NEW_SEARCH_RATE = 8
COUNT_HEADERS = f"{'admitted':>8} {'waited':>7} {'refused':>8}"


def _search_rate_is(rate: int) -> Callable[[Snapshot], bool]:
    def seen(snapshot: Snapshot) -> bool:
        rule = snapshot.rules.get(SEARCH)
        return rule is not None and rule.rate == rate

    return seen


@dataclass(frozen=True, slots=True)
class Change:
    """An operator's change: ``sql`` run at ``at`` x the run's length; ``seen`` once reloaded."""

    at: float
    sql: str
    what: str
    effect: str
    seen: Callable[[Snapshot], bool]


CHANGES = (
    Change(
        0.3,
        f"UPDATE {CONF_TABLE} SET rateLimit = {NEW_SEARCH_RATE} WHERE interfaceUrl = '{SEARCH}'",
        f"lower {SEARCH} from 20 to {NEW_SEARCH_RATE} calls/s",
        f"{SEARCH} is now limited to {NEW_SEARCH_RATE}/s (its bucket was rescaled, not reset)",
        _search_rate_is(NEW_SEARCH_RATE),
    ),
    Change(
        0.5,
        f"UPDATE {SWITCH_TABLE} SET enabled = 0 WHERE switchId = 1",
        "switch off",
        "switch off: every call is admitted at once, even on the closed interface",
        lambda snapshot: not snapshot.switch,
    ),
    Change(
        0.7,
        f"UPDATE {SWITCH_TABLE} SET enabled = 1 WHERE switchId = 1",
        "switch on",
        "switch on: the limits apply again",
        lambda snapshot: snapshot.switch,
    ),
)


class Tally:
    """Calls per (second, url): admitted, of which waited first, and refused."""

    __slots__ = ("_counts", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[int, str], list[int]] = {}

    def add(self, second: int, url: str, *, allowed: bool, waited: bool) -> None:
        """Count one decided call."""
        with self._lock:
            counts = self._counts.setdefault((second, url), [0, 0, 0])
            if allowed:
                counts[0] += 1
                counts[1] += int(waited)
            else:
                counts[2] += 1

    def second(self, second: int, url: str) -> tuple[int, int, int]:
        """(admitted, waited, refused) of ``url`` during ``second``."""
        with self._lock:
            a, w, r = self._counts.get((second, url), (0, 0, 0))
        return a, w, r

    def total(self, url: str) -> tuple[int, int, int]:
        """(admitted, waited, refused) of ``url`` over the whole run."""
        with self._lock:
            rows = [c for (_, u), c in self._counts.items() if u == url]
        return sum(c[0] for c in rows), sum(c[1] for c in rows), sum(c[2] for c in rows)


def rule_text(snapshot: Snapshot, url: str) -> str:
    """The rule in force for ``url``, as a table cell: permits/s (wait budget)."""
    if not snapshot.switch:
        return "switch off"
    rule: Rule | None = snapshot.rules.get(url)
    if rule is None:
        return "not limited"
    if rule.closed:
        return "closed"
    return f"{rule.rate}/s ({rule.cache:g} s)"


class DemoRun:
    """The traffic, the operator's changes and the display, for ``seconds``."""

    def __init__(
        self, limiter: GatewayLimiter, engine: Engine, console: Console, seconds: int
    ) -> None:
        self.limiter = limiter
        self.engine = engine
        self.console = console
        self.seconds = seconds
        self.tally = Tally()
        self.stop = threading.Event()
        self.start = time.monotonic()
        self.done: set[Change] = set()
        self.pending: list[tuple[Change, float]] = []
        self.shown = 0  # whole seconds already printed (plain output)
        #: The rules seen in force during each second, in order: a block shows what
        #: applied while its calls were decided, not what applies when it is printed.
        self.seen: dict[tuple[int, str], list[str]] = {}

    def elapsed(self) -> float:
        """Seconds since the traffic started."""
        return time.monotonic() - self.start

    def client(self, iface: DemoInterface, phase: float) -> None:
        """One client thread: a call every threads/demand seconds until stopped."""
        period = iface.threads / iface.demand
        next_at = self.elapsed() + phase
        while not self.stop.wait(max(0.0, next_at - self.elapsed())):
            # reserve() is try_acquire() without the sleep: the demo sleeps itself so
            # that it can tell the calls that waited from those admitted at once.
            verdict = self.limiter.reserve(iface.url)
            waited = verdict.allowed and verdict.wait_us > 0
            if waited and self.stop.wait(verdict.wait_us / US_PER_S):
                return
            self.tally.add(int(self.elapsed()), iface.url, allowed=verdict.allowed, waited=waited)
            # A thread that fell behind (it waited) does not burst to catch up.
            next_at = max(next_at + period, self.elapsed())

    def run(self) -> None:
        """Start the clients, show the run, stop every thread."""
        threads = [
            threading.Thread(
                target=self.client,
                # Threads of one interface take turns rather than call in step.
                args=(iface, i / iface.demand),
                name=f"demo-client-{iface.url}-{i}",
                daemon=True,
            )
            for iface in INTERFACES
            for i in range(iface.threads)
        ]
        self.start = time.monotonic()
        for thread in threads:
            thread.start()
        try:
            if self.console.is_terminal:
                self._show_live(threads)
            else:
                self._show_plain(threads)
        finally:
            self._halt(threads)

    def _halt(self, threads: list[threading.Thread]) -> None:
        self.stop.set()
        for thread in threads:
            thread.join(timeout=2.0)

    def tick(self) -> list[tuple[float, str]]:
        """Run the changes that are due; report the ones the reload has picked up, each
        line with the moment it happened (seconds into the run)."""
        now = self.elapsed()
        lines: list[tuple[float, str]] = []
        for change in CHANGES:
            # One change at a time: the next waits until a reload has shown the last,
            # so a short run or a slow reload never skips the switch being off.
            if change not in self.done and not self.pending and now >= change.at * self.seconds:
                with self.engine.begin() as conn:
                    conn.execute(text(change.sql))
                self.done.add(change)
                self.pending.append((change, now))
                lines.append((now, f"[{now:4.1f} s] event: {change.what}: {change.sql}"))
        snapshot = self.limiter.registry.snapshot
        self._note_rules(snapshot, int(now))
        for change, at in list(self.pending):
            if change.seen(snapshot):
                self.pending.remove((change, at))
                line = f"[{now:4.1f} s] reload, {now - at:.1f} s later: {change.effect}"
                lines.append((now, line))
        return lines

    def _note_rules(self, snapshot: Snapshot, second: int) -> None:
        for iface in INTERFACES:
            seen = self.seen.setdefault((second, iface.url), [])
            rule = rule_text(snapshot, iface.url)
            if not seen or seen[-1] != rule:
                seen.append(rule)

    def rules_during(self, second: int, url: str) -> str:
        """The rule(s) in force for ``url`` during ``second``, e.g. '20/s (0.2 s) -> 8/s'."""
        seen = self.seen.get((second, url))
        if not seen:
            return rule_text(self.limiter.registry.snapshot, url)
        return " -> ".join(seen)

    # --- plain text: one block per second -----------------------------------------------

    def _show_plain(self, threads: list[threading.Thread]) -> None:
        """Blocks and lines in the order things happened: a second's block is printed
        SETTLE after it ends, so a line of that moment (a reload just after the second)
        waits for the block of the second before it; else the block, printed after the
        line, would show the rule the line says is gone."""
        held: list[tuple[float, str]] = []

        def flush() -> None:  # the lines whose second's earlier blocks are all printed
            while held and int(held[0][0]) <= self.shown:
                self.console.out(held.pop(0)[1])

        while self.elapsed() < self.seconds:
            held.extend(self.tick())
            flush()
            while self.shown < self.seconds and self.elapsed() >= self.shown + 1 + SETTLE:
                self._block(self.shown)
                self.shown += 1
                flush()
            time.sleep(TICK)
        self._halt(threads)
        while self.shown < self.seconds:
            self._block(self.shown)
            self.shown += 1
            flush()
        held.extend((self.elapsed(), line) for line in self._not_seen())
        for _, line in held:
            self.console.out(line)

    def _block(self, second: int) -> None:
        out = self.console.out
        out(f"second {second + 1} ({second}-{second + 1} s)")
        out(f"  {'interface':<21} {'rule in force':<28} {COUNT_HEADERS}")
        for iface in INTERFACES:
            a, w, r = self.tally.second(second, iface.url)
            rule = self.rules_during(second, iface.url)
            out(f"  {iface.url:<21} {rule:<28} {a:>8} {w:>7} {r:>8}")

    def _not_seen(self) -> list[str]:
        return [
            f"[{self.elapsed():4.1f} s] ({change.what}: not reloaded yet when the demo ended)"
            for change, _ in self.pending
        ]

    # --- a terminal: one live table -----------------------------------------------------

    def _show_live(self, threads: list[threading.Thread]) -> None:
        with Live(self._table(), console=self.console, refresh_per_second=8) as live:
            while self.elapsed() < self.seconds:
                for _, line in self.tick():
                    live.console.print(Text(line))
                live.update(self._table())
                time.sleep(TICK)
            self._halt(threads)
            for line in self._not_seen():
                live.console.print(Text(line))
            live.update(self._table(final=True))

    def _table(self, *, final: bool = False) -> Table:
        snapshot = self.limiter.registry.snapshot
        now = min(self.elapsed(), float(self.seconds))
        last = min(int(now), self.seconds) - 1
        title = (
            f"after {self.seconds} s" if final else f"{now:4.1f} s of {self.seconds} s"
        ) + f"    switch {_on_off(snapshot.switch)}"
        table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
        table.add_column("interface")
        table.add_column("rule in force")
        for header in ("admitted", "waited", "refused"):
            table.add_column(f"{header}\nlast second", justify="right")
        for header in ("admitted", "waited", "refused"):
            table.add_column(f"{header}\nin total", justify="right")
        for iface in INTERFACES:
            second = self.tally.second(last, iface.url) if last >= 0 else (0, 0, 0)
            total = self.tally.total(iface.url)
            table.add_row(
                Text(iface.url),
                Text(rule_text(snapshot, iface.url)),
                *(Text(str(n)) for n in (*second, *total)),
            )
        return table


def _on_off(value: bool) -> str:
    return "on" if value else "OFF"


def _header(console: Console, seconds: int, settings: Settings, ids: dict[str, int]) -> None:
    out = console.out
    shared = settings.redis_url != "memory://"
    out(f"{PROG} demo: {seconds} s of traffic against {len(INTERFACES)} interfaces")
    out(f"  limits: {CONF_TABLE} in a temporary SQLite file, reloaded every {RELOAD_INTERVAL:g} s")
    if shared:
        out(f"  bucket state: {mask_secrets(settings.redis_url)}, key prefix {settings.key_prefix}")
    else:
        out("  bucket state: memory:// (inside this process; no server needed)")
    out("  rows, and the traffic sent to each:")
    for i in INTERFACES:
        meaning = (
            "disabled: not limited"
            if not i.enabled
            else ("closed: every call refused" if i.rate == 0 else "limited")
        )
        out(
            f"    configId {ids[i.url]}  {i.url:<21} rateLimit {i.rate:<3} cache {i.cache:<4g} "
            f"status {int(i.enabled)}  ({meaning}; asked ~{i.demand:g} calls/s by "
            f"{i.threads} thread{'s' if i.threads > 1 else ''})"
        )
    for line in (
        "each call is one decision: admitted at once, admitted after waiting for a permit",
        "(at most the row's cache), or refused; 'waited' counts the calls admitted after a",
        "wait, which 'admitted' counts too. A bucket starts full (one second's worth of",
        "permits saved up), so the first second admits up to about twice the rate",
    ):
        out(f"  {line}")
    out("  an operator will change the table with plain SQL; watch for 'event' and 'reload':")
    for change in CHANGES:
        out(f"    at ~{change.at * seconds:.1f} s: {change.what}")
    out("")


def _footer(console: Console, run: DemoRun) -> None:
    out = console.out
    out("")
    out(f"totals over {run.seconds} s:")
    out(f"  {'interface':<21} {COUNT_HEADERS} {'admitted/s':>11}")
    for iface in INTERFACES:
        a, w, r = run.tally.total(iface.url)
        out(f"  {iface.url:<21} {a:>8} {w:>7} {r:>8} {a / run.seconds:>11.1f}")
    out(
        "a bucket starts full (one second's worth of permits saved up), so the first second"
        " admits up to about twice the rate"
    )
    out("")
    out("next, on your own database (settings.toml, GATEWAY_LIMITER_DATABASE_URL or")
    out("--database-url; the default is sqlite:///gateway_limiter.db):")
    for why, command in (
        ("create the tables", "db upgrade"),
        ("add a limit, enabled", f"conf set {SEARCH} --rate 20 --cache 0.2 --enable"),
        ("every row, and the rows the reload skips", "conf list"),
        ("the rules in force and live bucket state", "--redis-url redis://127.0.0.1:6379 status"),
        ("stop limiting everywhere (also: on, default, status)", "switch off"),
    ):
        out(f"  # {why}")
        out(f"  {PROG} {command}")
    out("in code:")
    out("  from gateway_limiter import try_acquire")
    out(f'  if try_acquire("{SEARCH}"):')
    out("      call_supplier()")


def run_demo(
    seconds: int = 12,
    *,
    console: Console | None = None,
    redis_url: str = "memory://",
    web_port: int | None = None,
) -> int:
    """Run the demo for ``seconds`` and return 0; every thread is stopped on return.

    ``redis_url`` other than ``memory://`` shares the buckets through that Redis (under
    a key prefix of the demo's own); the table is always a temporary SQLite file.
    ``web_port``: also serve the operator console on 127.0.0.1 at that port.
    """
    serve = load_console_serve() if web_port is not None else None
    console = console or Console(highlight=False, soft_wrap=True)
    with tempfile.TemporaryDirectory(prefix="gateway-limiter-demo-") as tmp:
        database_url = f"sqlite:///{Path(tmp) / 'limits.db'}"
        settings = Settings(
            database_url=database_url,
            redis_url=redis_url,
            reload_interval=RELOAD_INTERVAL,
            key_prefix=f"gwl-demo-{uuid.uuid4().hex[:8]}",
        )
        engine = make_engine(database_url)
        try:
            upgrade(engine)
            ids = {
                i.url: upsert_conf(
                    engine,
                    i.url,
                    channel_type="IBE+",
                    rate_limit=i.rate,
                    cache=i.cache,
                    status=int(i.enabled),
                )[0].config_id
                for i in INTERFACES
            }
            limiter = open_limiter(settings)
            try:
                # A Redis that does not answer would quietly fall back to `local`;
                # the demo is about the shared state, so say so instead.
                limiter.backend.prepare()
                limiter.start()
                web = None
                if serve is not None and web_port is not None:
                    web = serve.demo_console(limiter, settings, web_port)  # type: ignore[attr-defined]
                    console.print(web.banner, markup=False, highlight=False)
                _header(console, seconds, settings, ids)
                run = DemoRun(limiter, engine, console, seconds)
                try:
                    run.run()
                finally:
                    if web is not None:
                        web.stop()
            finally:
                limiter.close()
            _footer(console, run)
        finally:
            engine.dispose()
    return 0
