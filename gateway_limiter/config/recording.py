"""What a reload hands to the audit: changes made with plain SQL, and the switch's
source's changes, each recorded on a thread of its own, never in the reload.

A first reload of a 10,000-row table would otherwise wait for 10,000 audit rows to be
written, and the switch's watcher would wait for the database. The recording itself
(comparing, locking, writing) is ``config/audit.py``'s; this module decides when to
ask for it and keeps one thread at a time at it.
"""

from __future__ import annotations

import queue
import threading
import time

from sqlalchemy import Engine

from gateway_limiter.config.audit import record_source_switch, record_sql_changes
from gateway_limiter.config.switch_source import Reading, SwitchSource, switch_value
from gateway_limiter.config.table import ConfRow, describe_db_error
from gateway_limiter.observe.logs import log

__all__ = ["ChangeRecorder"]


class ChangeRecorder:
    """Records in the audit what plain SQL changed (``sql``, at each reload) and what
    the switch's source said (``source_switch``), off the caller's thread."""

    def __init__(self, engine: Engine, source: SwitchSource) -> None:
        self._engine = engine
        self._source = source
        self._switch_recorder: threading.Thread | None = None
        self._switch_records: queue.Queue[tuple[bool | None, str] | None] = queue.Queue()
        #: The rows and switch the last recording of plain SQL changes that succeeded
        #: was asked for (None: none yet), and those the latest reload asks for.
        self._audited: tuple[list[ConfRow], bool | None] | None = None
        self._audit_wanted: tuple[list[ConfRow], bool | None] | None = None
        self._audit_lock = threading.Lock()
        self._auditing = False
        self._audit_again = False
        self._auditor: threading.Thread | None = None
        self._closed = False

    def source_switch(self, reading: Reading) -> None:
        """Have the audit record what the source said, on a thread of its own (the
        watcher never waits for the database)."""
        enabled = None if reading.text is None else switch_value(reading.text)
        self._switch_records.put((enabled, reading.version))
        with self._audit_lock:
            if self._switch_recorder is None or not self._switch_recorder.is_alive():
                self._switch_recorder = threading.Thread(
                    target=self._record_source_switches,
                    name="gateway-limiter-audit-switch",
                    daemon=True,
                )
                self._switch_recorder.start()

    def _record_source_switches(self) -> None:
        source = self._source
        failing = False
        while True:
            item = self._switch_records.get()
            try:
                if item is None:
                    return
                enabled, version = item
                try:
                    record_source_switch(self._engine, source.kind, source.shown, enabled, version)
                    failing = False
                except Exception as e:  # the audit must never cost the gateway its switch
                    if not failing:
                        log.warning(
                            "could not record the switch change at %s in the audit: %s",
                            source.shown,
                            describe_db_error(e),
                        )
                    failing = True
            finally:
                self._switch_records.task_done()

    def sql(self, rows: list[ConfRow], stored_switch: bool | None) -> None:
        """Have what plain SQL changed recorded (config.audit), when the rows or the
        switch differ from those of the last recording that succeeded: an unchanged
        table costs nothing more. A recording that fails or finds the lock taken leaves
        them unmarked, so the next reload tries again."""
        if (rows, stored_switch) == self._audited:
            return
        with self._audit_lock:
            self._audit_wanted = (rows, stored_switch)
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
            with self._audit_lock:
                wanted = self._audit_wanted
            try:
                if record_sql_changes(self._engine) is None:
                    # Another process holds the lock: compare again at the next reload.
                    log.debug("the audit lock is taken: compared again at the next reload")
                else:
                    # recorded: what this reload read is audited (read before the
                    # recording, so a change made since is found at the next reload)
                    self._audited = wanted
            except Exception as e:  # the audit must never cost the gateway its limits
                reason = describe_db_error(e)
                log.warning(
                    "could not record the table's changes in the audit (tried again at "
                    "the next reload): %s",
                    reason,
                )
            with self._audit_lock:
                if not self._audit_again or self._closed:
                    self._auditing = False
                    return
                self._audit_again = False

    def wait(self, timeout_s: float = 30.0) -> bool:
        """Wait until the recordings asked for are done; False if one still runs after
        ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        records = self._switch_records
        with records.all_tasks_done:  # the switch changes a source made, recorded
            if not records.all_tasks_done.wait_for(
                lambda: records.unfinished_tasks == 0, timeout_s
            ):
                return False
        auditor = self._auditor
        if auditor is not None:
            auditor.join(max(0.0, deadline - time.monotonic()))
            return not auditor.is_alive()
        return True

    def close(self) -> None:
        """Let a recording in flight finish its transaction (within the database's
        timeouts, at most 10 s), then end the switch's recording thread."""
        self._closed = True
        self.wait(timeout_s=10.0)
        if self._switch_recorder is not None:
            self._switch_records.put(None)
