"""A misspelt ``GATEWAY_LIMITER_*`` variable is a warning naming the nearest one, not
silence (a misspelt key in the file or a keyword is already an error)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gateway_limiter.config.settings import Settings, load_settings
from gateway_limiter.observe.logs import LOGGER_NAME


@pytest.fixture
def warnings_seen(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> pytest.LogCaptureFixture:
    monkeypatch.chdir(tmp_path)  # no ./settings.toml
    caplog.set_level(logging.WARNING, logger=LOGGER_NAME)
    return caplog


def test_a_misspelt_variable_is_named_with_the_nearest_valid_one(
    warnings_seen: pytest.LogCaptureFixture,
) -> None:
    settings = load_settings(environ={"GATEWAY_LIMITER_REDIS_ULR": "redis://cache:6379/0"})

    assert settings.redis_url == Settings().redis_url  # still ignored: it is no setting
    (record,) = warnings_seen.records
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert "GATEWAY_LIMITER_REDIS_ULR" in message
    assert "did you mean GATEWAY_LIMITER_REDIS_URL?" in message
    assert "cache:6379" not in message  # the value is not shown (it may hold a password)


def test_each_unknown_variable_gets_its_own_line(
    warnings_seen: pytest.LogCaptureFixture,
) -> None:
    load_settings(
        environ={
            "GATEWAY_LIMITER_SETTING": "/etc/gateway/limits.toml",
            "GATEWAY_LIMITER_RELOAD_INTERVALL": "5",
        }
    )

    messages = [r.getMessage() for r in warnings_seen.records]
    assert len(messages) == 2, messages
    assert "did you mean GATEWAY_LIMITER_RELOAD_INTERVAL?" in messages[0]
    assert "did you mean GATEWAY_LIMITER_SETTINGS?" in messages[1]


def test_a_variable_like_no_setting_lists_the_variables_read(
    warnings_seen: pytest.LogCaptureFixture,
) -> None:
    load_settings(environ={"GATEWAY_LIMITER_HOME": "/opt/gateway"})

    (record,) = warnings_seen.records
    message = record.getMessage()
    assert "GATEWAY_LIMITER_HOME" in message
    assert "did you mean" not in message
    assert "GATEWAY_LIMITER_DATABASE_URL" in message and "GATEWAY_LIMITER_SETTINGS" in message


def test_every_valid_variable_and_others_pass_without_a_word(
    warnings_seen: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    file = tmp_path / "limits.toml"
    file.write_text('key_prefix = "file"\n', encoding="utf-8")
    environ = {
        "GATEWAY_LIMITER_SETTINGS": str(file),
        "GATEWAY_LIMITER_DATABASE_URL": "sqlite:///limits.db",
        "GATEWAY_LIMITER_REDIS_URL": "memory://",
        "GATEWAY_LIMITER_REDIS_POOL_SIZE": "8",
        "GATEWAY_LIMITER_SWITCH": "on",
        "PATH": "/usr/bin",
        "gateway_limiter_redis_ulr": "lower case: not ours",
    }

    settings = load_settings(environ=environ)

    assert settings.key_prefix == "file" and settings.redis_pool_size == 8
    assert warnings_seen.records == []
