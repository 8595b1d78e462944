"""``switch``, ``status`` and the console when the switch is kept in etcd or Apollo: each
says which source is in force and what it holds, and none writes the table's row or
offers to; they say where to change it instead."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine

from gateway_limiter.config.settings import Settings
from gateway_limiter.config.table import read_switch
from gateway_limiter.console.app import make_app
from gateway_limiter.console.serve import ConsoleServer, redis_sources
from tests.support.commandline import cli
from tests.support.switch_sources import Centre

pytestmark = pytest.mark.usefixtures("no_local_settings")

TOKEN = "console-token-for-tests-0123456789"


def settings_file(tmp_path: Path, db: str, source: str) -> Path:
    path = tmp_path / "settings.toml"
    path.write_text(
        f'database_url = "{db}"\nredis_url = "memory://"\nswitch = true\n'
        f'switch_source = "{source}"\n'
    )
    return path


def test_switch_status_reads_the_source_and_on_off_refuse_naming_where_to_change_it(
    centre: Centre,
    migrated_db: tuple[str, Engine],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db, engine = migrated_db
    settings = str(settings_file(tmp_path, db, centre.url()))
    centre.set("Off")
    ran = cli(capsys, "--settings", settings, "switch", "status")
    assert ran.code == 0, ran.err
    assert ran.out.splitlines()[0] == f"switch off ({centre.kind} {centre.url()} " + (
        "(setting switch_source): 'Off')"
    )
    assert "to change it, set it in" in ran.out

    refused = cli(capsys, "--settings", settings, "switch", "on")
    assert refused.code == 2
    assert f"the switch is kept in {centre.kind} {centre.url()}" in refused.err
    assert "not in the table" in refused.err
    change = "etcdctl" if centre.kind == "etcd" else "namespace application"
    assert change in refused.err
    assert read_switch(engine) is None  # nothing written

    centre.delete()
    ran = cli(capsys, "--settings", settings, "switch", "status")
    assert ran.out.startswith("switch on (settings default: switch = true; no key")

    centre.set("maybe")
    ran = cli(capsys, "--settings", settings, "switch", "status")
    assert ran.code == 1 and "'maybe', not on/off" in ran.err

    centre.stop()
    ran = cli(capsys, "--settings", settings, "switch", "status")
    assert ran.code == 1
    assert "cannot read the switch from" in ran.err and "last good state" in ran.err


def test_status_names_the_source_in_force(
    centre: Centre,
    migrated_db: tuple[str, Engine],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = str(settings_file(tmp_path, migrated_db[0], centre.url()))
    centre.set("off")
    ran = cli(capsys, "--settings", settings, "status")
    assert f"switch: off ({centre.kind} {centre.url()})" in ran.out, ran.out + ran.err
    listed = cli(capsys, "--settings", settings, "conf", "list")
    assert f"switch: kept in {centre.kind} {centre.url()} (setting switch_source" in listed.out
    centre.stop()
    ran = cli(capsys, "--settings", settings, "status")
    assert f"switch: on (settings default: {centre.kind} {centre.url()} not reached)" in ran.out


def test_the_console_shows_the_source_and_its_value_and_says_where_to_change_it(
    centre: Centre, migrated_db: tuple[str, Engine]
) -> None:
    db, engine = migrated_db
    centre.set("off")
    settings = Settings(
        database_url=db, redis_url="memory://", console_token=TOKEN, switch_source=centre.url()
    )
    sources, view = redis_sources(settings, "console-test")
    server = ConsoleServer(make_app(sources), "127.0.0.1", 0).start()
    headers = {"Authorization": f"Bearer {TOKEN}"}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", headers=headers) as http:
            shown = http.get("/api/switch").json()
            assert shown["source"] == centre.kind and shown["where"] == centre.url()
            assert (shown["effective"], shown["value"], shown["error"]) == (False, "off", None)
            assert http.get("/api/status").json()["switch"]["source"] == centre.kind
            refused = http.put("/api/switch", json={"enabled": True})
            assert refused.status_code == 409
            assert "not in the table" in refused.json()["error"]
            page = http.get("/").text
            assert 'data-switch="true"' not in page  # no toggle to offer
            assert "The switch is not kept in the table: to change it, set it in" in page
    finally:
        server.stop()
        view.registry.close()
        view.backend.close()
        sources.engine.dispose()
    assert read_switch(engine) is None
