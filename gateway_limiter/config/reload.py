"""The registry: the rules in force, reloaded from the table, swapped in one assignment.

A reload reads every row and the switch, builds a new immutable ``Snapshot`` and
assigns it to ``registry.snapshot``. The decision path reads that attribute and never
takes a lock. A reload that cannot read the database keeps the last good snapshot,
logs once per outage, and the next tick tries again.

Listeners (``Registry.listeners``) hear of every reload, good or failed; the metrics
count reloads that way, whoever started them (the scheduler, ``reload()``, the CLI).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from gateway_limiter.config.recording import ChangeRecorder
from gateway_limiter.config.rules import Rule, Skipped, build_rules
from gateway_limiter.config.settings import Settings
from gateway_limiter.config.switch_source import (
    FIRST_READING_WAIT_S,
    Reading,
    SwitchFollower,
    SwitchWatcher,
    parse_switch_source,
)
from gateway_limiter.config.table import (
    describe_db_error,
    make_engine,
    missing_sqlite_file,
    read_rows,
    read_switch,
    table_missing,
)
from gateway_limiter.observe.logs import OUTAGE_REPORT_SECONDS, Throttle, held_back, log
from gateway_limiter.observe.redact import mask_secrets

#: Spread reloads of a fleet so they do not hit the database in the same instant.
RELOAD_JITTER = 0.1  # as a fraction of reload_interval
#: APScheduler logs every job added and every start at INFO: noise in a gateway's log.
SCHEDULER_LOGGER = "apscheduler"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Rules and switch as of one reload; never mutated, only replaced."""

    rules: Mapping[str, Rule] = field(default_factory=lambda: MappingProxyType({}))
    switch: bool = True
    #: "database" when the switch row decided it, "settings" when the default did,
    #: "etcd" or "apollo" when the key of setting ``switch_source`` did.
    switch_source: str = "settings"
    skipped: tuple[Skipped, ...] = ()
    #: time.time() of the reload that built it; None before any successful reload.
    loaded_at: float | None = None
    #: URLs whose rows are all disabled: admitted unlimited, but "disabled", not unknown.
    disabled: frozenset[str] = frozenset()
    #: (url, callerKey) -> a named caller's rule (``RuleSet.named``); empty for most.
    named: Mapping[tuple[str, str], Rule] = field(default_factory=lambda: MappingProxyType({}))
    #: What the rules found odd but applied (``RuleSet.warnings``), logged when new.
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ReloadSummary:
    """What a reload did: returned by ``start()`` and ``reload()``; ``str()`` says it in
    one line.

    Attributes:
        ok: False when the database could not be read: the last good limits stay.
        added: the URLs of the rules added.
        changed: the URLs of the rules changed.
        removed: the URLs of the rules removed.
        skipped: the rows the reload could not use, each with its ``configId`` and why.
        switch: the global switch after the reload.
        rules: the rules in force after the reload.
        error: why the reload failed, when ``ok`` is False.
        switch_only: not a reload: a switch kept in etcd or Apollo changed, nothing else.
    """

    ok: bool
    added: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    skipped: tuple[Skipped, ...] = ()
    switch: bool = True
    rules: int = 0
    error: str | None = None
    #: Not a reload: the switch's source (etcd, Apollo) changed the switch, nothing else.
    switch_only: bool = False

    def __str__(self) -> str:
        if not self.ok:
            return f"reload failed, last good limits kept: {self.error}"
        return (
            f"{self.rules} rules (+{len(self.added)} ~{len(self.changed)} -{len(self.removed)}), "
            f"{len(self.skipped)} rows skipped, switch {'on' if self.switch else 'off'}"
        )


class DatabaseOutage:
    """Whether the reload finds the database down, and what has been said of it: one
    error per outage, and a database that comes and goes reported at most once per
    ``OUTAGE_REPORT_SECONDS``, with a count of the outages in between."""

    def __init__(self) -> None:
        self.down = False
        self._reports = Throttle(OUTAGE_REPORT_SECONDS)
        self._reported = False
        #: Taken to decide whether an outage is reported yet: the reload's thread and
        #: the scheduler's (a reload stuck on the database) may both want to say so.
        self._lock = threading.Lock()

    def begun_unread(self) -> None:
        """An outage began, already reported (no database file at the first reload)."""
        self.down = True
        self._reported = True  # so the reload that finds the file says so

    def failed(self, reason: str, *, loaded: bool) -> None:
        """A reload failed for ``reason``; ``loaded``: limits were read before."""
        with self._lock:
            if not loaded and not self.down:
                log.error(
                    "cannot load limits from the database (%s): NO LIMITS IN FORCE, every "
                    "call is admitted until a reload succeeds",
                    reason,
                )
                self._reported = True
            elif not self.down:
                held = self._reports.ready("database")
                self._reported = held is not None
                if held is not None:
                    log.error(
                        "cannot reload limits (%s); keeping the last good limits%s",
                        reason,
                        held_back(held),
                    )
                else:
                    log.debug("cannot reload limits (%s); keeping the last good limits", reason)
            else:
                log.debug("reload still failing: %s", reason)
            self.down = True

    def stuck(self, running: float, interval: float) -> None:
        """A reload has been running for ``running`` s at a tick of ``interval`` s."""
        with self._lock:
            if self.down:  # this outage is reported already
                log.debug("reload still running after %.1f s", running)
                return
            self.down = True
            held = self._reports.ready("database")  # as failed: flaps throttled
            self._reported = held is not None
            if held is None:
                log.debug("reload still running after %.1f s", running)
                return
            log.error(
                "a reload has been running for %.1f s (reload_interval %s s): the database "
                "does not answer in time; keeping the last good limits until a reload ends%s",
                running,
                interval,
                held_back(held),
            )

    def over(self) -> None:
        """A reload succeeded: an outage, if any, is over (said if it was reported)."""
        with self._lock:
            if self.down:
                if self._reported:
                    log.warning("database reachable again; limits reloaded")
                self.down = False


def summarise(old: Snapshot, new: Snapshot) -> ReloadSummary:
    """What a good reload changed from ``old`` to ``new``; logs what is new in it (a row
    skipped or a warning when it first appears, not on every tick; the switch turned)."""
    added = tuple(sorted(u for u in new.rules if u not in old.rules))
    removed = tuple(sorted(u for u in old.rules if u not in new.rules))
    changed = tuple(sorted(u for u, r in new.rules.items() if u in old.rules and old.rules[u] != r))
    if old.named != new.named:  # a named caller's limits changed: its URL changed
        moved = {url for (url, _), _rule in old.named.items() ^ new.named.items()}
        changed = tuple(sorted(set(changed) | (moved & new.rules.keys() - set(added))))
    before = {(s.config_id, s.reason) for s in old.skipped}
    for s in new.skipped:
        if (s.config_id, s.reason) not in before:
            log.warning("row skipped: %s", s)
    for warning in new.warnings:
        if warning not in old.warnings:
            log.warning("%s", warning)
    if old.switch != new.switch and old.loaded_at is not None:
        log.warning("global switch turned %s", "on" if new.switch else "off")
    summary = ReloadSummary(
        ok=True,
        added=added,
        changed=changed,
        removed=removed,
        skipped=new.skipped,
        switch=new.switch,
        rules=len(new.rules),
    )
    if added or changed or removed:
        log.info("limits reloaded: %s", summary)
    return summary


class Registry:
    """Loads rules from the table; ``snapshot`` is what the decision path reads."""

    def __init__(self, settings: Settings, engine: Engine | None = None) -> None:
        self.settings = settings
        self.snapshot = Snapshot(switch=settings.switch)
        #: Where the switch comes from (setting ``switch_source``).
        self.switch_source = source = parse_switch_source(settings.switch_source)
        #: The reload and the switch's watcher both replace ``snapshot``: one at a time.
        self._swap_lock = threading.Lock()
        self._follower: SwitchFollower | None = None
        self._watcher: SwitchWatcher | None = None
        if source.external:
            self._follower = SwitchFollower(source, settings.switch, self._switch_changed)
            self._watcher = SwitchWatcher(self._follower)
        self._engine = engine if engine is not None else make_engine(settings.database_url)
        self._reload_lock = threading.Lock()
        self._switch_table_missing = False
        self._scheduler: Any = None
        self._outage = DatabaseOutage()
        self._reload_began: float | None = None  # time.monotonic() of a reload running
        #: What plain SQL and the switch's source change, recorded in the audit.
        self._recorder = ChangeRecorder(self._engine, source)
        #: Called with the summary of every reload, good or failed (metrics count them).
        self.listeners: list[Callable[[ReloadSummary], None]] = []

    @property
    def engine(self) -> Engine:
        """The engine the rules are read with."""
        return self._engine

    def wait_for_audit(self, timeout_s: float = 30.0) -> bool:
        """Wait until the recording of plain-SQL changes started by a reload is done
        (tests, and ``close``); False if it still runs after ``timeout_s``."""
        return self._recorder.wait(timeout_s)

    def reload(self) -> ReloadSummary:
        """Read the table now and swap the new snapshot in; never raises.

        Whatever goes wrong (the database, or a value no check foresaw) keeps the last
        good snapshot: a reload runs in the caller's thread at ``start`` and must not
        take the gateway down with it.
        """
        with self._reload_lock:  # one reload at a time (the scheduler and a caller may race)
            self._reload_began = time.monotonic()
            try:
                summary = self._reload()
            finally:
                self._reload_began = None
        for listener in self.listeners:
            listener(summary)
        return summary

    def _reload(self) -> ReloadSummary:
        missing = missing_sqlite_file(self._engine.url)
        if missing is not None:
            # Connecting would create an empty file (and the next reload would find no
            # table in it): a limiter run where no settings point at a database.
            return self._no_database_file(missing)
        try:
            rows = read_rows(self._engine, display=False)
            ruleset = build_rules(
                rows,
                self.settings.default_cache,
                self.settings.default_time_zone,
                self.settings.quota_pacing_burst,
            )
            # Read with the rows: a switch that cannot be read keeps the whole last good
            # snapshot, rows and switch together (only a missing table means the setting).
            stored_switch = None if self._follower is not None else self._read_switch()
        except Exception as e:  # whatever it is: see reload's docstring
            return self._failed(e)
        if self.settings.audit_sql_changes:
            self._recorder.sql(rows, stored_switch)
        with self._swap_lock:  # the switch's watcher may swap a snapshot in meanwhile
            if self._follower is not None:
                switch, switch_source = self._follower.enabled, self._follower.origin
            elif stored_switch is None:
                switch, switch_source = self.settings.switch, "settings"
            else:
                switch, switch_source = stored_switch, "database"
            new = Snapshot(
                rules=ruleset.rules,
                switch=switch,
                switch_source=switch_source,
                skipped=ruleset.skipped,
                loaded_at=time.time(),
                disabled=ruleset.disabled,
                named=ruleset.named,
                warnings=ruleset.warnings,
            )
            old = self.snapshot
            self.snapshot = new  # the one assignment the decision path sees
        return self._succeeded(old, new)

    # --- the switch from etcd or Apollo (setting switch_source) ---------------------------

    def _switch_changed(self, enabled: bool, origin: str, reading: Reading | None) -> None:
        """The switch's source changed the switch: swap it into the snapshot (called by
        the watcher, in its thread or task); the listeners hear of it as of a reload."""
        with self._swap_lock:
            new = replace(self.snapshot, switch=enabled, switch_source=origin)
            self.snapshot = new
        summary = ReloadSummary(
            ok=True, skipped=new.skipped, switch=enabled, rules=len(new.rules), switch_only=True
        )
        for listener in self.listeners:
            listener(summary)
        if reading is not None and self.settings.audit_sql_changes:
            self._recorder.source_switch(reading)

    def wait_for_switch_source(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the switch's source (etcd, Apollo) to be read
        once (``start`` waits only ``FIRST_READING_WAIT_S``); whether it has been. True
        at once for the table."""
        if self._watcher is None:
            return True
        deadline = time.monotonic() + timeout_s
        while not self.switch_follower_reached():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._watcher.reached.wait(left)
        return True

    def switch_follower_reached(self) -> bool:
        """Whether the switch's source (etcd, Apollo) has answered this process yet."""
        return self._follower is not None and self._follower.reached

    def start_following(self, *, wait: bool = True) -> None:
        """Follow the switch's source on a thread of its own (etcd, Apollo; nothing for
        the table); ``wait``: up to ``FIRST_READING_WAIT_S`` for its first reading (the
        threaded limiter's ``start`` waits, then reloads: ``start_following_async``)."""
        if self._watcher is not None:
            self._watcher.start_thread(wait_s=FIRST_READING_WAIT_S if wait else 0.0)

    async def start_following_async(self) -> None:
        """Follow the switch's source as a task on the running loop (the asyncio limiter),
        waiting up to ``FIRST_READING_WAIT_S`` for its first reading."""
        if self._watcher is not None:
            await self._watcher.start_task()

    async def stop_following_async(self) -> None:
        """End the task ``start_following_async`` started."""
        if self._watcher is not None:
            await self._watcher.stop_task()

    def stop_following(self) -> None:
        """End the thread ``start_following`` started (``close`` ends it too)."""
        if self._watcher is not None:
            self._watcher.stop_thread()

    def _read_switch(self) -> bool | None:
        """The switch row (None: the setting decides). Only a switch table proven
        missing means the setting; any other failure (a lock wait past the read timeout,
        a lost connection, no permission) raises, and the reload keeps its last good
        snapshot."""
        try:
            value = read_switch(self._engine)
        except SQLAlchemyError as e:
            if not table_missing(e):
                raise
            # A schema made from older DDL: the settings default applies.
            if not self._switch_table_missing:
                log.warning(
                    "switch table missing (%s); using the switch setting. "
                    "Run 'gateway-limiter db upgrade'.",
                    describe_db_error(e),
                )
                self._switch_table_missing = True
            return None
        self._switch_table_missing = False
        return value

    def _no_database_file(self, path: Path) -> ReloadSummary:
        reason = f"database file {path} does not exist"
        if self.snapshot.loaded_at is not None or self._outage.down:
            # It was there (or something else failed first): an outage like any other.
            return self._failed(FileNotFoundError(reason))
        url = self._engine.url.render_as_string(hide_password=True)
        default = url == Settings.__dataclass_fields__["database_url"].default
        log.warning(
            "%s (database_url %s%s): no limits in force, every call is admitted. Configure "
            "the limiter with GATEWAY_LIMITER_SETTINGS=/path/to/settings.toml, a "
            "./settings.toml, or GATEWAY_LIMITER_DATABASE_URL=<SQLAlchemy URL>, and create "
            "the tables with 'gateway-limiter db upgrade'",
            reason,
            mask_secrets(url),
            ", the default" if default else "",
        )
        self._outage.begun_unread()
        return ReloadSummary(ok=False, switch=self.snapshot.switch, rules=0, error=reason)

    def _failed(self, error: BaseException) -> ReloadSummary:
        reason = describe_db_error(error)
        self._outage.failed(reason, loaded=self.snapshot.loaded_at is not None)
        return ReloadSummary(
            ok=False, switch=self.snapshot.switch, rules=len(self.snapshot.rules), error=reason
        )

    def _reload_stuck(self) -> None:
        """The scheduler found the last reload still running at a tick (the database
        does not answer within its timeouts): one error for the outage, not one a tick."""
        began = self._reload_began
        running = 0.0 if began is None else time.monotonic() - began
        self._outage.stuck(running, self.settings.reload_interval)

    def _succeeded(self, old: Snapshot, new: Snapshot) -> ReloadSummary:
        self._outage.over()
        return summarise(old, new)

    def start(self, *, follow_switch: bool = True) -> ReloadSummary:
        """Reload now, then every ``reload_interval`` seconds in a background thread.

        ``follow_switch``: also follow the switch's source (etcd, Apollo) in a thread,
        waiting up to ``FIRST_READING_WAIT_S`` for its first reading (the asyncio limiter
        passes False and follows it as a task: ``start_following_async``).
        """
        if follow_switch:
            self.start_following(wait=False)
        summary = self.reload()
        if follow_switch and self._watcher is not None:
            self._watcher.settled.wait(FIRST_READING_WAIT_S)
            if summary.ok:  # what the source said since the reload
                summary = replace(summary, switch=self.snapshot.switch)
        if self._scheduler is None:
            from apscheduler.schedulers.background import BackgroundScheduler

            quiet_scheduler_logs()
            interval = self.settings.reload_interval
            # Its own log, through which a tick that finds the last reload still running
            # is one error per outage (_reload_stuck), not a warning on every tick.
            scheduler = BackgroundScheduler(daemon=True, logger=SchedulerLog(self))
            scheduler.add_job(
                self.reload,
                spread_interval(interval, interval * RELOAD_JITTER),
                id="gateway_limiter.reload",
                coalesce=True,  # missed ticks (a stalled process) run once, not in a burst
                max_instances=1,  # a slow database never gets two reloads at once
                misfire_grace_time=max(1, int(interval)),
            )
            scheduler.start()
            self._scheduler = scheduler
        return summary

    def close(self) -> None:
        """Stop reloading and release database connections."""
        scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None:
            scheduler.shutdown(wait=False)
        if self._watcher is not None:
            self._watcher.stop_thread()
            self._watcher.abandon()  # a task's loop stops it (stop_following_async)
        # A recording in flight finishes its transaction (it holds the database's
        # timeouts) before the engine goes.
        self._recorder.close()
        self._engine.dispose()


class SchedulerLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """APScheduler's logger for one registry: its lines as they are, but for "skipped:
    maximum number of running instances reached", which it logs on every tick while a
    reload runs, and which goes to ``Registry._reload_stuck`` instead."""

    def __init__(self, registry: Registry) -> None:
        super().__init__(logging.getLogger(f"{SCHEDULER_LOGGER}.scheduler"), {})
        self._registry = registry

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        """Log as the scheduler's logger does, but for the one line above."""
        if isinstance(msg, str) and "maximum number of running instances" in msg:
            self._registry._reload_stuck()
            return
        super().log(level, msg, *args, **kwargs)


def spread_interval(interval: float, jitter: float) -> Any:
    """An APScheduler trigger firing every ``interval`` seconds, each time up to
    ``jitter`` seconds later, drawn from a random generator of its own.

    APScheduler's own ``jitter`` draws from the ``random`` module's shared generator, in
    the scheduler's thread: each reload would move the numbers the application draws
    from it, so a program that seeds ``random`` to repeat a run would not repeat, and
    Hypothesis warns that a strategy uses ``random`` when a reload falls in a draw.
    """
    from apscheduler.triggers.interval import IntervalTrigger

    class SpreadInterval(IntervalTrigger):  # type: ignore[misc]
        __slots__ = ("_draws",)

        def __init__(self) -> None:
            super().__init__(seconds=interval)
            self._draws = random.Random()

        def get_next_fire_time(self, previous: datetime | None, now: datetime) -> datetime | None:
            fire: datetime | None = super().get_next_fire_time(previous, now)
            if fire is None:
                return None
            return fire + timedelta(seconds=self._draws.uniform(0.0, jitter))

    return SpreadInterval()


def quiet_scheduler_logs() -> None:
    """Show APScheduler's own lines from WARNING up, unless its logger was configured.

    Its INFO lines (a job added, the scheduler started or shut down) say nothing a
    gateway's operator needs; a level set on the ``apscheduler`` logger by the
    application (anything but NOTSET) is left as it is.
    """
    logger = logging.getLogger(SCHEDULER_LOGGER)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.WARNING)
