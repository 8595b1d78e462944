"""The global switch kept in etcd or Apollo (setting ``switch_source``), docs/design.md.

Against a real etcd (Debian's etcd-server, a private one per module, or per test when
the test stops it) and a loopback server implementing Apollo's documented config API
(tests/support/switch_sources.py): a flip reaches the process within 1 s, a deleted
key means the ``switch`` setting, a bad value keeps the last good state, an outage
keeps it too with one error in the log, and 3 processes follow one key.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import Engine

from gateway_limiter import GatewayLimiter
from gateway_limiter.aio import AsyncGatewayLimiter
from gateway_limiter.config.audit import read_audit
from gateway_limiter.config.migrate import upgrade
from gateway_limiter.config.reload import ReloadSummary
from gateway_limiter.config.table import make_engine, write_switch
from tests.support.limiting import write_row
from tests.support.services import TlsFiles, free_port
from tests.support.switch_sources import ApolloCentre, ApolloServer, Centre, EtcdCentre, EtcdServer

ROOT = Path(__file__).parents[2]
#: The promise: a change at the source reaches every process within this long.
FOLLOW_S = 1.0


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    server = EtcdServer().start()
    yield server
    server.stop()


@pytest.fixture
def db(tmp_path: Path) -> Iterator[tuple[str, Engine]]:
    """A migrated SQLite file with one row: /x, 1 call per second, no local cache."""
    url = f"sqlite:///{tmp_path / 'limits.db'}"
    engine = make_engine(url)
    upgrade(engine)
    write_row(engine, "/x", rateLimit=1, cache=0.0)
    yield url, engine
    engine.dispose()


class Heard:
    """A registry listener: the switch each change swapped in, as events to wait on."""

    def __init__(self, limiter: GatewayLimiter | AsyncGatewayLimiter) -> None:
        self.limiter = limiter
        self.changes: queue.Queue[bool] = queue.Queue()
        self.last = limiter.registry.snapshot.switch
        limiter.registry.listeners.append(self)

    def __call__(self, summary: ReloadSummary) -> None:
        switch = self.limiter.registry.snapshot.switch
        if switch != self.last:
            self.last = switch
            self.changes.put(switch)

    def next(self, timeout: float = FOLLOW_S) -> bool:
        """The next change, within ``timeout`` (a failure otherwise)."""
        try:
            return self.changes.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"no switch change within {timeout} s")

    def none(self, timeout: float) -> None:
        """No change for ``timeout``."""
        with contextlib.suppress(queue.Empty):
            got = self.changes.get(timeout=timeout)
            pytest.fail(f"the switch changed to {got} when it should have stayed")


class Records(logging.Handler):
    """Log records of the gateway_limiter logger, with an event per matching record."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._seen = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        with self._seen:
            self.records.append(record)
            self._seen.notify_all()

    def lines(self, level: int) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno == level]

    def wait_for(
        self, test: Callable[[logging.LogRecord], bool], count: int, timeout: float
    ) -> None:
        with self._seen:
            if not self._seen.wait_for(
                lambda: sum(1 for r in self.records if test(r)) >= count, timeout
            ):
                pytest.fail(f"fewer than {count} such log records within {timeout} s")


@pytest.fixture
def records() -> Iterator[Records]:
    handler = Records()
    logger = logging.getLogger("gateway_limiter")
    old = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(old)


def started(db_url: str, source: str, **settings: Any) -> GatewayLimiter:
    limiter = GatewayLimiter(
        database_url=db_url,
        redis_url="memory://",
        switch_source=source,
        reload_interval=3600,
        **settings,
    )
    limiter.start()
    return limiter


def reloads_counted() -> float:
    return REGISTRY.get_sample_value("gateway_limiter_reloads_total", {"outcome": "ok"}) or 0.0


def admitted(limiter: GatewayLimiter, calls: int = 5) -> int:
    return sum(limiter.try_acquire("/x", timeout=0) for _ in range(calls))


def test_a_flip_at_the_source_reaches_the_process_within_a_second(
    centre: Centre, db: tuple[str, Engine], records: Records
) -> None:
    centre.set("on")
    limiter = started(db[0], centre.url(), switch=False)
    try:
        heard = Heard(limiter)
        snapshot = limiter.registry.snapshot
        assert (snapshot.switch, snapshot.switch_source) == (True, centre.kind)
        limiter.registry.start_following()  # a second start follows with the same thread
        watchers = [t for t in threading.enumerate() if t.name == "gateway-limiter-switch"]
        assert len(watchers) == 1
        assert admitted(limiter) == 1  # 1 call/s: the limit applies
        reloads = reloads_counted()
        for value, expected in (("OFF", False), ("true", True), ("0", False), ("Y", True)):
            centre.set(value)
            assert heard.next() is expected, value
        centre.set("n")
        assert heard.next() is False
        assert admitted(limiter) == 5  # off: nothing is limited
        assert REGISTRY.get_sample_value("gateway_limiter_switch_on") == 0.0
        centre.set("1")
        assert heard.next() is True
        assert limiter.registry.snapshot.switch_source == centre.kind
        assert REGISTRY.get_sample_value("gateway_limiter_switch_on") == 1.0
        assert reloads_counted() == reloads  # a flip is no reload
    finally:
        limiter.close()
    assert not records.lines(logging.ERROR)


def test_a_deleted_key_means_the_switch_setting_and_a_bad_value_keeps_the_last_good(
    centre: Centre, db: tuple[str, Engine], records: Records
) -> None:
    centre.set("on")
    limiter = started(db[0], centre.url(), switch=False)
    try:
        heard = Heard(limiter)
        assert limiter.registry.snapshot.switch is True
        centre.delete()
        assert heard.next() is False  # the setting: off
        assert limiter.registry.snapshot.switch_source == "settings"
        assert any("not found" in line for line in records.lines(logging.WARNING))
        centre.set("on")
        assert heard.next() is True
        centre.set("maybe")
        records.wait_for(lambda r: "'maybe'" in r.getMessage(), 1, FOLLOW_S)
        heard.none(0.3)
        assert limiter.registry.snapshot.switch is True  # the last good state
        warning = next(w for w in records.lines(logging.WARNING) if "'maybe'" in w)
        assert "keeping the switch on" in warning
        centre.set("off")
        assert heard.next() is False
    finally:
        limiter.close()


def test_an_outage_keeps_the_last_good_state_with_one_error_and_resumes(
    centre: Centre, db: tuple[str, Engine], records: Records
) -> None:
    centre.set("off")
    limiter = started(db[0], centre.url(), switch=True)
    try:
        heard = Heard(limiter)
        assert limiter.registry.snapshot.switch is False
        centre.stop()
        # The watcher fails, retries and fails again (several times): still off.
        records.wait_for(lambda r: "still unreachable" in r.getMessage(), 3, 10.0)
        assert limiter.registry.snapshot.switch is False
        assert admitted(limiter) == 5
        errors = records.lines(logging.ERROR)
        assert len(errors) == 1, errors
        assert "keeping the last good state: switch off" in errors[0]
        centre.start()
        records.wait_for(lambda r: "reachable again" in r.getMessage(), 1, 5.0)
        centre.set("on")
        assert heard.next() is True
        assert len(records.lines(logging.ERROR)) == 1
    finally:
        limiter.close()


def test_a_process_that_never_reached_the_source_starts_from_the_setting_and_says_so(
    centre: Centre, db: tuple[str, Engine], records: Records
) -> None:
    centre.set("on")
    centre.stop()
    limiter = started(db[0], centre.url(), switch=False)
    try:
        assert limiter.registry.snapshot.switch is False
        assert limiter.registry.snapshot.switch_source == "settings"
        (error,) = records.lines(logging.ERROR)
        assert "never reached" in error and "starting from the switch setting" in error
        assert not limiter.registry.wait_for_switch_source(0.0)
        heard = Heard(limiter)
        centre.start()
        assert heard.next(timeout=5.0) is True  # read as soon as it answers
        assert limiter.registry.wait_for_switch_source(0.0)
    finally:
        limiter.close()


async def test_the_asyncio_limiter_follows_the_source_as_a_task(
    centre: Centre, db: tuple[str, Engine]
) -> None:
    centre.set("off")
    limiter = AsyncGatewayLimiter(
        database_url=db[0], redis_url="memory://", switch_source=centre.url(), reload_interval=3600
    )
    await limiter.start()
    try:
        assert limiter.registry.snapshot.switch is False
        assert not any(t.name == "gateway-limiter-switch" for t in threading.enumerate())
        assert [await limiter.try_acquire("/x", timeout=0) for _ in range(3)] == [True] * 3
        heard = Heard(limiter)
        centre.set("on")
        assert await asyncio.to_thread(heard.next) is True  # the loop runs the task meanwhile
        assert [await limiter.try_acquire("/x", timeout=0) for _ in range(3)] == [
            True,
            False,
            False,
        ]
    finally:
        await limiter.aclose()
    assert not limiter.registry._watcher or limiter.registry._watcher._task is None


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["etcd", "apollo"])
def test_three_processes_follow_one_key_within_a_second(
    kind: str, etcd: EtcdServer, db: tuple[str, Engine]
) -> None:
    apollo = ApolloServer().start() if kind == "apollo" else None
    centre: Centre = ApolloCentre(apollo) if apollo is not None else EtcdCentre(etcd)
    centre.set("on")
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.switch_watch", db[0], centre.url()],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    lines: list[queue.Queue[str]] = []
    for p in processes:
        q: queue.Queue[str] = queue.Queue()
        assert p.stdout is not None
        threading.Thread(target=lambda f=p.stdout, q=q: [q.put(x) for x in f], daemon=True).start()
        lines.append(q)
    try:
        for q in lines:
            assert q.get(timeout=30).split() == ["ready", "on"]
        for value, word in (("off", "off"), ("on", "on"), ("false", "off")):
            flipped = time.time()
            centre.set(value)
            for n, q in enumerate(lines):
                said = q.get(timeout=5).split()
                assert said[:2] == ["switch", word], (n, said)
                assert float(said[2]) - flipped < FOLLOW_S, (n, value, float(said[2]) - flipped)
    finally:
        for p in processes:
            assert p.stdin is not None
            p.stdin.close()
        for p in processes:
            p.wait(10)
        if apollo is not None:
            apollo.stop()


def test_the_audit_records_each_change_at_the_source_once(
    centre: Centre, migrated_db: tuple[str, Engine]
) -> None:
    url, engine = migrated_db
    centre.set("on")
    write_switch(engine, True)  # the row is not in force: it is no part of what follows
    fleet = [started(url, centre.url()) for _ in range(2)]
    try:
        heard = [Heard(limiter) for limiter in fleet]
        centre.set("off")
        assert all(h.next() is False for h in heard)
        centre.set("on")
        assert all(h.next() is True for h in heard)
        for limiter in fleet:
            assert limiter.registry.wait_for_audit()
        fleet[0].reload()
        assert fleet[0].registry.wait_for_audit()
    finally:
        for limiter in fleet:
            limiter.close()
    switches = [e for e in read_audit(engine) if e["action"] == "switch"]
    # The row's own change (plain SQL) is recorded as ever, and no more: the source's
    # entries are never mistaken for a change of the row.
    assert [e["afterRow"] for e in switches if e["source"] == "sql"] == [{"enabled": True}]
    entries = [e for e in switches if e["source"] != "sql"]
    assert [e["source"] for e in entries] == [centre.kind] * 3, entries
    assert [e["afterRow"]["enabled"] for e in reversed(entries)] == [True, False, True]
    assert {e["actor"] for e in entries} == {centre.url()}


def test_an_etcd_that_wants_a_login_is_followed_and_the_password_never_logged(
    db: tuple[str, Engine], records: Records
) -> None:
    server = EtcdServer().start()
    try:
        centre = EtcdCentre(server)
        password = "s3cr@t:pw"
        server.enable_auth(password)
        centre.set("off")
        port, key = server.port, centre.key
        limiter = started(db[0], f"etcd://root:s3cr%40t%3Apw@127.0.0.1:{port}/{key}")
        try:
            assert limiter.registry.snapshot.switch is False
            heard = Heard(limiter)
            centre.set("on")
            assert heard.next() is True
        finally:
            limiter.close()
        wrong = started(db[0], f"etcd://root:not-{password}@127.0.0.1:{port}/{key}", switch=False)
        wrong.close()
        (error,) = records.lines(logging.ERROR)
        assert "never reached" in error and "authenticate" in error
        assert all("s3cr" not in r.getMessage() for r in records.records)
    finally:
        server.stop()


def test_an_etcd_over_tls_with_a_client_certificate_is_followed(
    db: tuple[str, Engine], tmp_path: Path, records: Records
) -> None:
    server = EtcdServer(tls=TlsFiles.make(tmp_path)).start()
    try:
        centre = EtcdCentre(server)
        centre.set("off")
        limiter = started(db[0], centre.url())
        try:
            assert limiter.registry.snapshot.switch is False
            heard = Heard(limiter)
            centre.set("on")
            assert heard.next() is True
        finally:
            limiter.close()
        # Without its client certificate the server refuses it: never reached.
        bare = centre.url().split("&ssl_certfile")[0]
        refused = started(db[0], bare, switch=False)
        assert refused.registry.snapshot.switch_source == "settings"
        refused.close()
        assert len(records.lines(logging.ERROR)) == 1
    finally:
        server.stop()


def test_several_etcd_hosts_one_of_them_down_are_followed_without_an_error(
    etcd: EtcdServer, db: tuple[str, Engine], records: Records
) -> None:
    centre = EtcdCentre(etcd)
    centre.set("off")
    down = free_port()  # nothing listens there
    source = f"etcd://127.0.0.1:{down},127.0.0.1:{etcd.port}/{centre.key}"
    limiter = started(db[0], source)
    try:
        assert limiter.registry.snapshot.switch is False
        heard = Heard(limiter)
        centre.set("on")
        assert heard.next() is True
    finally:
        limiter.close()
    assert not records.lines(logging.ERROR)  # a host down is no outage while another answers
