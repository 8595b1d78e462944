"""A bad setting fails at load, naming the key and the value, and never showing a password."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway_limiter.config.settings import Settings, SettingsError, load_settings

SECRET = "s3cr3t-pw"


@pytest.fixture(autouse=True)
def _no_settings_file_in_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        ("reload_interval = -1", "reload_interval=-1"),
        ("reload_interval = '10'", "reload_interval=10"),
        ("reload_interval = nan", "reload_interval=nan"),
        ("on_backend_error = 'maybe'", "on_backend_error=maybe"),
        ("redis_url = 'http://x'", "redis_url=http://x"),
        ("database_url = 'limits.db'", "database_url=limits.db"),
        ("key_prefix = 'has space'", "key_prefix=has space"),
        ("switch = 'yes'", "switch=yes"),
        ("default_cache = 10.0", "default_cache=10.0"),
        ("redis_timeout = 0", "redis_timeout=0"),
        ("redis_connect_timeout = -0.5", "redis_connect_timeout=-0.5"),
        ("redis_pool_size = 0", "redis_pool_size=0"),
        ("redis_pool_size = 2.5", "redis_pool_size=2.5"),
        ("breaker_seconds = -1", "breaker_seconds=-1"),
    ],
)
def test_bad_value_in_file_fails_naming_key_and_value(
    tmp_path: Path, line: str, shown: str
) -> None:
    file = tmp_path / "bad.toml"
    file.write_text(line + "\n", encoding="utf-8")

    with pytest.raises(SettingsError) as error:
        load_settings(file, environ={})

    assert shown in str(error.value)


@pytest.mark.parametrize(
    ("key", "text"),
    [
        ("switch", "perhaps"),
        ("reload_interval", "soon"),
        ("reload_interval", "-1"),
        ("redis_pool_size", "1.5"),
        ("on_backend_error", "maybe"),
        ("redis_url", "http://x"),
    ],
)
def test_bad_value_in_env_fails_naming_key_and_value(key: str, text: str) -> None:
    with pytest.raises(SettingsError) as error:
        load_settings(environ={f"GATEWAY_LIMITER_{key.upper()}": text})

    assert key in str(error.value)
    assert text in str(error.value)


def test_bad_keyword_fails_naming_key_and_value() -> None:
    with pytest.raises(SettingsError, match=r"on_backend_error=maybe"):
        load_settings(environ={}, on_backend_error="maybe")


def test_bad_value_in_constructor_fails_the_same_way() -> None:
    with pytest.raises(SettingsError, match=r"reload_interval=0\.0"):
        Settings(reload_interval=0.0)


def test_unknown_key_in_file_is_an_error_naming_it(tmp_path: Path) -> None:
    file = tmp_path / "typo.toml"
    file.write_text("reload_intervall = 5\n", encoding="utf-8")

    with pytest.raises(SettingsError, match=r"reload_intervall"):
        load_settings(file, environ={})


def test_unknown_key_under_gateway_limiter_table_is_an_error(tmp_path: Path) -> None:
    file = tmp_path / "typo.toml"
    file.write_text("[gateway_limiter]\nredis_uri = 'redis://h'\n", encoding="utf-8")

    with pytest.raises(SettingsError, match=r"redis_uri"):
        load_settings(file, environ={})


def test_unknown_keyword_is_a_type_error_naming_it() -> None:
    with pytest.raises(TypeError, match=r"reload_intervall"):
        load_settings(environ={}, reload_intervall=5)


def test_file_that_is_not_toml_is_an_error_naming_the_file(tmp_path: Path) -> None:
    file = tmp_path / "broken.toml"
    file.write_text("reload_interval = = 5\n", encoding="utf-8")

    with pytest.raises(SettingsError, match=r"broken\.toml"):
        load_settings(file, environ={})


@pytest.mark.parametrize("source", ["file", "env", "keyword"])
@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("redis_url", f"http://gw:{SECRET}@cache.internal:6379/0"),
        ("redis_url", f"redis+clustr://:{SECRET}@cache.internal:7000"),
        ("redis_url", f"gw:{SECRET}@cache.internal:6379"),  # scheme forgotten
        ("database_url", f"gw:{SECRET}@db.internal/limits"),  # scheme forgotten
    ],
)
def test_password_in_a_bad_url_is_masked_in_the_error(
    tmp_path: Path, source: str, key: str, value: str
) -> None:
    file = tmp_path / "limits.toml"
    file.write_text(f"{key} = '{value}'\n", encoding="utf-8")

    with pytest.raises(SettingsError) as error:
        if source == "file":
            load_settings(file, environ={})
        elif source == "env":
            load_settings(environ={f"GATEWAY_LIMITER_{key.upper()}": value})
        else:
            keywords: dict[str, Any] = {key: value}
            load_settings(environ={}, **keywords)

    message = str(error.value)
    assert key in message
    assert SECRET not in message
    assert "***" in message


def test_password_in_a_url_is_not_shown_when_another_key_is_bad(tmp_path: Path) -> None:
    file = tmp_path / "limits.toml"
    file.write_text(
        f"database_url = 'mysql+pymysql://gw:{SECRET}@db/limits'\nreload_interval = -1\n",
        encoding="utf-8",
    )

    with pytest.raises(SettingsError) as error:
        load_settings(file, environ={})

    assert "reload_interval" in str(error.value)
    assert SECRET not in str(error.value)


def test_masked_settings_hide_passwords_of_both_urls() -> None:
    settings = Settings(
        database_url=f"mysql+pymysql://gw:{SECRET}@db/limits",
        redis_url=f"redis://:{SECRET}@cache:6379/0",
    )

    shown = settings.masked()

    assert shown["database_url"] == "mysql+pymysql://gw:***@db/limits"
    assert shown["redis_url"] == "redis://:***@cache:6379/0"
