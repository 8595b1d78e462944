"""The site's command-line and settings references are made from the code when the site
is built (docs_hooks.py), so they name every command, option and key there is."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import docs_hooks
from gateway_limiter.cli import COMMANDS
from gateway_limiter.config.settings import Settings

CHECKOUT = Path(__file__).resolve().parents[2]


def test_the_command_line_reference_has_every_command_and_its_options() -> None:
    text = docs_hooks.command_line()
    for entry in COMMANDS:
        assert f"`gateway-limiter {entry.name}`" in text
    for command in ("conf set", "conf delete", "db upgrade", "switch"):
        assert f"`gateway-limiter {command}`" in text
    assert "--quota-period" in text and "--lease-ms" in text and "--settings" in text


def test_the_settings_reference_shows_every_key() -> None:
    text = docs_hooks.settings_file()
    for field in dataclasses.fields(Settings):
        assert f"\n{field.name} = " in text


def test_the_reference_pages_ask_for_the_generated_parts() -> None:
    for page, marker in (("cli.md", "command line"), ("settings.md", "settings.toml")):
        markdown = (CHECKOUT / "docs" / "reference" / page).read_text(encoding="utf-8")
        built = docs_hooks.on_page_markdown(markdown)
        assert f"<!-- generated: {marker} -->" in markdown
        assert "<!-- generated:" not in built and len(built) > 2 * len(markdown)
