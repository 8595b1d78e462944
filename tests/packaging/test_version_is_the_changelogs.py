"""The version the package says it is (``gateway_limiter.__version__``, which
pyproject.toml reads, and so the installed metadata) is the CHANGELOG's latest release."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import gateway_limiter

CHANGELOG = Path(__file__).resolve().parents[2] / "CHANGELOG.md"
RELEASE = re.compile(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", re.MULTILINE)


def test_the_latest_release_in_the_changelog_is_the_packages_version() -> None:
    releases = RELEASE.findall(CHANGELOG.read_text(encoding="utf-8"))
    assert releases, "CHANGELOG.md names no release as '## [X.Y.Z] - YYYY-MM-DD'"
    assert releases[0] == gateway_limiter.__version__
    assert importlib.metadata.version("gateway-limiter") == gateway_limiter.__version__


def test_the_changelog_opens_with_an_unreleased_section() -> None:
    headings = re.findall(r"^## (.+)$", CHANGELOG.read_text(encoding="utf-8"), re.MULTILINE)
    assert headings[0] == "[Unreleased]"
