"""The console answers only requests for the address it listens on (and the names of
``console_hosts``): a page of another site whose name is made to resolve to it (DNS
rebinding) reads nothing. Any bad path or query value is a 4xx, and every response, an
error's too, carries the security headers."""

from __future__ import annotations

import httpx
import pytest

from gateway_limiter.config.settings import Settings, SettingsError
from gateway_limiter.console.app import SECURITY_HEADERS, host_allowed
from tests.console.conftest import Served


def _secured(answer: httpx.Response) -> None:
    for name, value in SECURITY_HEADERS.items():
        assert answer.headers.get(name) == value, (name, answer.status_code)


def test_another_host_name_reads_nothing(console: Served) -> None:
    port = console.url.rsplit(":", 1)[1]
    with console.client() as client:
        for path in ("/", "/api/rules", "/api/audit", "/api/status"):
            answer = client.get(path, headers={"Host": f"rebound.example:{port}"})
            assert answer.status_code == 400, path
            assert "rows" not in answer.text and "entries" not in answer.text
            _secured(answer)
        refused = client.patch(
            "/api/rules/1", json={"rateLimit": 1}, headers={"Host": "rebound.example"}
        )
        assert refused.status_code == 400
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost"):
            assert client.get("/api/rules", headers={"Host": host}).status_code == 200, host


def test_bad_path_and_query_values_are_4xx_with_the_security_headers(console: Served) -> None:
    with console.client() as client:
        for method, path, status in (
            ("GET", "/api/audit?limit=²", 400),
            ("GET", "/api/audit?configId=²", 400),
            ("GET", "/api/audit?configId=99999999999999999999", 400),
            ("DELETE", "/api/rules/²", 404),
            ("PATCH", "/api/rules/١٢", 404),
            ("GET", "/api/nothing-here", 404),
            ("POST", "/api/status", 405),
        ):
            answer = client.request(method, path, json={"rateLimit": 1})
            assert answer.status_code == status, (method, path, answer.text)
            _secured(answer)


@pytest.mark.parametrize(
    ("host", "listen", "extra", "allowed"),
    [
        ("127.0.0.1:8088", "127.0.0.1", (), True),
        ("localhost:8088", "127.0.0.1", (), True),
        ("[::1]:8088", "::1", (), True),
        ("rebound.example:8088", "127.0.0.1", (), False),
        ("10.0.0.5:8088", "127.0.0.1", (), False),
        ("", "127.0.0.1", (), False),
        ("console.example", "10.0.0.5", ("console.example",), True),
        ("Console.Example:443", "10.0.0.5", ("console.example",), True),
        ("10.0.0.5:8088", "10.0.0.5", (), True),
        ("localhost", "10.0.0.5", (), False),
        ("rebound.example", "0.0.0.0", (), False),
        ("192.168.1.9:8088", "0.0.0.0", (), True),
    ],
)
def test_which_hosts_a_console_answers(
    host: str, listen: str, extra: tuple[str, ...], allowed: bool
) -> None:
    assert host_allowed(host, listen, extra) is allowed


def test_console_hosts_names_are_checked() -> None:
    assert Settings(console_hosts="a.example, B.example").console_hosts
    with pytest.raises(SettingsError, match="console_hosts"):
        Settings(console_hosts="a.example:8080")


@pytest.mark.parametrize("written", ["1234567890123456789", "12345678.90123456", "true"])
def test_a_console_token_of_another_type_is_never_shown(written: str) -> None:
    from pathlib import Path
    from tempfile import TemporaryDirectory

    from gateway_limiter.config.settings import load_settings

    with TemporaryDirectory() as folder:
        path = Path(folder) / "settings.toml"
        path.write_text(f"console_token = {written}\n")
        with pytest.raises(SettingsError) as refused:
            load_settings(path, environ={})
    message = str(refused.value)
    assert "console_token=***" in message
    assert written not in message and written[:8] not in message
