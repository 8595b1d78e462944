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
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, NoSuchTableError, SQLAlchemyError

from gateway_limiter.config.audit import record_sql_changes
from gateway_limiter.config.rules import Rule, Skipped, build_rules
from gateway_limiter.config.settings import Settings
from gateway_limiter.config.table import (
    ConfRow,
    make_engine,
    missing_sqlite_file,
    read_rows,
    read_switch,
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
    #: "database" when the switch row decided it, "settings" when the default did.
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
    """What a reload did."""

    ok: bool
    added: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    skipped: tuple[Skipped, ...] = ()
    switch: bool = True
    rules: int = 0
    error: str | None = None

    def __str__(self) -> str:
        if not self.ok:
            return f"reload failed, last good limits kept: {self.error}"
        return (
            f"{self.rules} rules (+{len(self.added)} ~{len(self.changed)} -{len(self.removed)}), "
            f"{len(self.skipped)} rows skipped, switch {'on' if self.switch else 'off'}"
        )


def describe_db_error(error: BaseException) -> str:
    """A one-line, password-free account of a database error."""
    if isinstance(error, NoSuchTableError):
        text = f"NoSuchTableError: table {error} does not exist"
    elif isinstance(error, DBAPIError) and error.orig is not None:
        text = f"{type(error.orig).__name__}: {error.orig}"
    else:
        text = f"{type(error).__name__}: {error}"
    return mask_secrets(text.splitlines()[0] if text else type(error).__name__)


class Registry:
    """Loads rules from the table; ``snapshot`` is what the decision path reads."""

    def __init__(self, settings: Settings, engine: Engine | None = None) -> None:
        self.settings = settings
        self.snapshot = Snapshot(switch=settings.switch)
        self._engine = engine if engine is not None else make_engine(settings.database_url)
        self._reload_lock = threading.Lock()
        self._db_down = False
        self._switch_table_missing = False
        self._scheduler: Any = None
        self._outages = Throttle(OUTAGE_REPORT_SECONDS)
        self._outage_reported = False
        #: The rows the last reload recorded plain SQL changes against (None: not yet).
        self._audited_rows: list[ConfRow] | None = None
        self._audited_switch: bool | None = None
        self._audit_lock = threading.Lock()
        self._auditing = False
        self._audit_again = False
        self._auditor: threading.Thread | None = None
        self._closed = False
        #: Called with the summary of every reload, good or failed (metrics count them).
        self.listeners: list[Callable[[ReloadSummary], None]] = []

    @property
    def engine(self) -> Engine:
        """The engine the rules are read with."""
        return self._engine

    def reload(self) -> ReloadSummary:
        """Read the table now and swap the new snapshot in; never raises.

        Whatever goes wrong (the database, or a value no check foresaw) keeps the last
        good snapshot: a reload runs in the caller's thread at ``start`` and must not
        take the gateway down with it.
        """
        with self._reload_lock:  # one reload at a time (the scheduler and a caller may race)
            summary = self._reload()
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
                rows, self.settings.default_cache, self.settings.default_time_zone
            )
        except Exception as e:  # whatever it is: see reload's docstring
            return self._failed(e)
        stored_switch = self._read_switch()
        if self.settings.audit_sql_changes:
            self._audit_sql(rows, stored_switch)
        switch = self.settings.switch if stored_switch is None else stored_switch
        new = Snapshot(
            rules=ruleset.rules,
            switch=switch,
            switch_source="settings" if stored_switch is None else "database",
            skipped=ruleset.skipped,
            loaded_at=time.time(),
            disabled=ruleset.disabled,
            named=ruleset.named,
            warnings=ruleset.warnings,
        )
        old = self.snapshot
        self.snapshot = new  # the one assignment the decision path sees
        return self._succeeded(old, new)

    def _audit_sql(self, rows: list[ConfRow], stored_switch: bool | None) -> None:
        """Have what plain SQL changed recorded (config.audit), when the rows or the
        switch differ from the last reload's: an unchanged table costs nothing more.

        The recording runs on a thread of its own, never in the reload: a first reload
        of a 10,000-row table would otherwise wait for 10,000 audit rows to be written.
        """
        if rows == self._audited_rows and stored_switch == self._audited_switch:
            return
        self._audited_rows, self._audited_switch = rows, stored_switch
        with self._audit_lock:
            if self._auditing:  # the running one goes round once more when done
                self._audit_again = True
                return
            self._auditing = True
        self._auditor = threading.Thread(
            target=self._record_sql_changes, name="gateway-limiter-audit", daemon=True
        )
        self._auditor.start()

    def _record_sql_changes(self) -> None:
        while True:
            try:
                if record_sql_changes(self._engine) is None:
                    # Another process holds the lock: compare again at the next reload.
                    self._audited_rows = None
            except Exception as e:  # the audit must never cost the gateway its limits
                reason = describe_db_error(e)
                log.warning("could not record the table's changes in the audit: %s", reason)
            with self._audit_lock:
                if not self._audit_again or self._closed:
                    self._auditing = False
                    return
                self._audit_again = False

    def wait_for_audit(self, timeout_s: float = 30.0) -> bool:
        """Wait until the recording of plain-SQL changes started by a reload is done
        (tests, and ``close``); False if it still runs after ``timeout_s``."""
        auditor = self._auditor
        if auditor is not None:
            auditor.join(timeout_s)
            return not auditor.is_alive()
        return True

    def _read_switch(self) -> bool | None:
        try:
            value = read_switch(self._engine)
        except SQLAlchemyError as e:
            # The limits table answered, so the database is up: the switch table is
            # missing (a schema made from older DDL). The settings default applies.
            if not self._switch_table_missing:
                log.warning(
                    "switch table unreadable (%s); using the switch setting. "
                    "Run 'gateway-limiter db upgrade'.",
                    describe_db_error(e),
                )
                self._switch_table_missing = True
            return None
        self._switch_table_missing = False
        return value

    def _no_database_file(self, path: Path) -> ReloadSummary:
        reason = f"database file {path} does not exist"
        if self.snapshot.loaded_at is not None or self._db_down:
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
        self._db_down = True
        self._outage_reported = True  # so the reload that finds the file says so
        return ReloadSummary(ok=False, switch=self.snapshot.switch, rules=0, error=reason)

    def _failed(self, error: BaseException) -> ReloadSummary:
        reason = describe_db_error(error)
        if self.snapshot.loaded_at is None and not self._db_down:
            log.error(
                "cannot load limits from the database (%s): NO LIMITS IN FORCE, every call "
                "is admitted until a reload succeeds",
                reason,
            )
            self._outage_reported = True
        elif not self._db_down:
            # Once per outage; and a database that comes and goes is reported at most
            # once per OUTAGE_REPORT_SECONDS, with a count of the outages in between.
            held = self._outages.ready("database")
            self._outage_reported = held is not None
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
        self._db_down = True
        return ReloadSummary(
            ok=False, switch=self.snapshot.switch, rules=len(self.snapshot.rules), error=reason
        )

    def _succeeded(self, old: Snapshot, new: Snapshot) -> ReloadSummary:
        if self._db_down:
            if self._outage_reported:
                log.warning("database reachable again; limits reloaded")
            self._db_down = False
        added = tuple(sorted(u for u in new.rules if u not in old.rules))
        removed = tuple(sorted(u for u in old.rules if u not in new.rules))
        changed = tuple(
            sorted(u for u, r in new.rules.items() if u in old.rules and old.rules[u] != r)
        )
        if old.named != new.named:  # a named caller's limits changed: its URL changed
            moved = {url for (url, _), _rule in old.named.items() ^ new.named.items()}
            changed = tuple(sorted(set(changed) | (moved & new.rules.keys() - set(added))))
        # Warn about a skipped row when it first appears, not on every tick.
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

    def start(self) -> ReloadSummary:
        """Reload now, then every ``reload_interval`` seconds in a background thread."""
        summary = self.reload()
        if self._scheduler is None:
            from apscheduler.schedulers.background import BackgroundScheduler

            quiet_scheduler_logs()
            interval = self.settings.reload_interval
            scheduler = BackgroundScheduler(daemon=True)
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
        self._closed = True
        # A recording in flight finishes its transaction (it holds the database's
        # timeouts) before the engine goes.
        self.wait_for_audit(timeout_s=10.0)
        self._engine.dispose()


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
