"""``gateway-limiter rls``: its arguments, and the docs' Envoy configuration being the
one the tests run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.commandline import cli
from tests.support.envoy import EGRESS_YAML

ROOT = Path(__file__).resolve().parents[2]


def test_the_command_is_listed(capsys: pytest.CaptureFixture[str]) -> None:
    ran = cli(capsys, "--help")
    assert ran.code == 0
    assert "rls" in ran.out


@pytest.mark.parametrize("listen", ["8081", "127.0.0.1", "127.0.0.1:99999", "a b:1"])
def test_a_bad_listen_address_is_bad_usage(capsys: pytest.CaptureFixture[str], listen: str) -> None:
    ran = cli(capsys, "rls", "--listen", listen)
    assert ran.code == 2
    assert "host:port" in ran.err


def test_an_address_in_use_is_one_line_and_exit_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        db = tmp_path / "x.db"
        db.touch()
        ran = cli(
            capsys,
            "--database-url",
            f"sqlite:///{db}",
            "rls",
            "--listen",
            f"127.0.0.1:{port}",
        )
    assert ran.code == 1
    assert f"rls on 127.0.0.1:{port}" in ran.err
    assert "Traceback" not in ran.err


def test_the_docs_show_the_envoy_configuration_the_tests_run() -> None:
    page = (ROOT / "docs" / "envoy.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", page, re.DOTALL)
    assert EGRESS_YAML.read_text() in blocks
