"""Where settings come from: defaults < file < GATEWAY_LIMITER_<KEY> < keyword arguments."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from gateway_limiter.config.settings import Settings, SettingsError, load_settings

SHIPPED_FILE = Path(__file__).resolve().parents[2] / "settings.toml"


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def empty_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with no settings.toml in it."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def test_defaults_apply_when_no_file_env_or_keyword(empty_cwd: Path) -> None:
    assert load_settings(environ={}) == Settings()


def test_each_layer_overrides_the_one_below(tmp_path: Path, empty_cwd: Path) -> None:
    file = _write(
        tmp_path / "limits.toml",
        'key_prefix = "file"\nreload_interval = 2.5\nswitch = false\nredis_timeout = 0.2\n',
    )
    environ = {
        "GATEWAY_LIMITER_KEY_PREFIX": "env",
        "GATEWAY_LIMITER_RELOAD_INTERVAL": "3",
        "GATEWAY_LIMITER_ON_BACKEND_ERROR": "deny",
    }

    settings = load_settings(file, environ=environ, key_prefix="kw")

    assert settings.key_prefix == "kw"  # keyword > env > file
    assert settings.reload_interval == 3.0  # env > file
    assert settings.on_backend_error == "deny"  # env > default
    assert settings.switch is False  # file > default
    assert settings.redis_timeout == 0.2  # file > default
    assert settings.redis_url == Settings().redis_url  # default, set nowhere


def test_keyword_none_leaves_the_lower_layers_alone(tmp_path: Path) -> None:
    # The command line passes None for an option the user did not give.
    file = _write(tmp_path / "limits.toml", 'redis_url = "redis://127.0.0.1:6379/1"\n')

    settings = load_settings(file, environ={}, redis_url=None)

    assert settings.redis_url == "redis://127.0.0.1:6379/1"


@pytest.mark.parametrize(
    ("key", "text", "value"),
    [
        ("database_url", "mysql+pymysql://u@db/limits", "mysql+pymysql://u@db/limits"),
        ("redis_url", "redis+cluster://10.0.0.1:7000", "redis+cluster://10.0.0.1:7000"),
        ("key_prefix", "gw.prod", "gw.prod"),
        ("reload_interval", "2.5", 2.5),
        ("switch", "off", False),
        ("default_cache", "0", 0.0),
        ("on_backend_error", "allow", "allow"),
        ("redis_timeout", "0.1", 0.1),
        ("redis_connect_timeout", "2", 2.0),
        ("redis_pool_size", "8", 8),
        ("breaker_seconds", "0.25", 0.25),
    ],
)
def test_every_key_has_an_env_override(empty_cwd: Path, key: str, text: str, value: object) -> None:
    settings = load_settings(environ={f"GATEWAY_LIMITER_{key.upper()}": text})

    assert getattr(settings, key) == value
    assert type(getattr(settings, key)) is type(getattr(Settings(), key))


@pytest.mark.parametrize(
    ("text", "value"),
    [("true", True), ("1", True), ("YES", True), ("on", True), ("False", False), ("0", False)],
)
def test_switch_from_env_accepts_the_usual_spellings(
    empty_cwd: Path, text: str, value: bool
) -> None:
    assert load_settings(environ={"GATEWAY_LIMITER_SWITCH": text}).switch is value


def test_whole_numbers_in_a_file_are_accepted_for_seconds(tmp_path: Path) -> None:
    file = _write(tmp_path / "limits.toml", "reload_interval = 5\nbreaker_seconds = 2\n")

    settings = load_settings(file, environ={})

    assert settings.reload_interval == 5.0
    assert isinstance(settings.reload_interval, float)
    assert isinstance(settings.breaker_seconds, float)


def test_explicit_path_beats_the_settings_env_variable(tmp_path: Path) -> None:
    explicit = _write(tmp_path / "explicit.toml", 'key_prefix = "explicit"\n')
    named = _write(tmp_path / "named.toml", 'key_prefix = "named"\n')

    settings = load_settings(explicit, environ={"GATEWAY_LIMITER_SETTINGS": str(named)})

    assert settings.key_prefix == "explicit"


def test_settings_env_variable_names_the_file(tmp_path: Path, empty_cwd: Path) -> None:
    named = _write(tmp_path / "named.toml", 'key_prefix = "named"\n')

    settings = load_settings(environ={"GATEWAY_LIMITER_SETTINGS": str(named)})

    assert settings.key_prefix == "named"


def test_settings_env_variable_beats_settings_toml_in_working_directory(
    tmp_path: Path, empty_cwd: Path
) -> None:
    _write(empty_cwd / "settings.toml", 'key_prefix = "cwd"\n')
    named = _write(tmp_path / "named.toml", 'key_prefix = "named"\n')

    settings = load_settings(environ={"GATEWAY_LIMITER_SETTINGS": str(named)})

    assert settings.key_prefix == "named"


def test_settings_toml_in_working_directory_is_found(empty_cwd: Path) -> None:
    _write(empty_cwd / "settings.toml", 'key_prefix = "cwd"\n')

    assert load_settings(environ={}).key_prefix == "cwd"


def test_explicit_path_that_does_not_exist_is_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.toml"

    with pytest.raises(SettingsError, match=re.escape(str(missing))):
        load_settings(missing, environ={})


def test_settings_env_variable_naming_a_missing_file_is_an_error(
    tmp_path: Path, empty_cwd: Path
) -> None:
    missing = tmp_path / "nowhere.toml"

    with pytest.raises(SettingsError, match=re.escape(str(missing))):
        load_settings(environ={"GATEWAY_LIMITER_SETTINGS": str(missing)})


def test_keys_under_a_gateway_limiter_table_are_accepted(tmp_path: Path) -> None:
    file = _write(
        tmp_path / "shared.toml",
        """
[other_program]
port = 8080

[gateway_limiter]
key_prefix = "shared"
switch = false
""",
    )

    settings = load_settings(file, environ={})

    assert settings.key_prefix == "shared"
    assert settings.switch is False


def test_base_settings_sit_below_the_file(tmp_path: Path) -> None:
    file = _write(tmp_path / "limits.toml", 'key_prefix = "file"\n')
    base = Settings(key_prefix="base", redis_pool_size=4)

    settings = load_settings(file, environ={}, base=base)

    assert settings.key_prefix == "file"
    assert settings.redis_pool_size == 4


def test_shipped_settings_toml_loads_to_exactly_the_defaults() -> None:
    assert load_settings(SHIPPED_FILE, environ={}) == Settings()


def test_shipped_settings_toml_documents_every_key_and_its_env_override() -> None:
    text = SHIPPED_FILE.read_text(encoding="utf-8")

    for field in dataclasses.fields(Settings):
        assert re.search(rf"^{field.name} = ", text, re.MULTILINE), field.name
        assert f"GATEWAY_LIMITER_{field.name.upper()}" in text, field.name
