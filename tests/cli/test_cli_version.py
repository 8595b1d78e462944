"""``gateway-limiter --version`` prints the installed version, or the source's own when
the package metadata is missing (a checkout run without installing)."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

import gateway_limiter
from tests.support.commandline import cli


def test_version_prints_the_installed_version_and_exits_0(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ran = cli(capsys, "--version")
    assert ran.code == 0, ran.err
    assert ran.out == f"gateway-limiter {importlib.metadata.version('gateway-limiter')}\n"
    assert ran.err == ""


def test_version_in_a_real_process(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gateway_limiter", "--version"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"gateway-limiter {importlib.metadata.version('gateway-limiter')}"


def test_version_falls_back_to_the_source_without_metadata(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    monkeypatch.setattr(gateway_limiter, "__version__", "9.8.7")
    ran = cli(capsys, "--version")
    assert (ran.code, ran.out) == (0, "gateway-limiter 9.8.7\n")
