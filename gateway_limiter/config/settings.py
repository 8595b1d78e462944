"""Settings: defaults, then ``settings.toml``, then ``GATEWAY_LIMITER_<KEY>``, then keywords.

Every key is validated when loaded; an error names the key and the (masked) value, so
a typo in a file or an environment variable fails at start, never on the first call.
A ``GATEWAY_LIMITER_*`` variable that names no setting is logged as a warning with the
nearest name, since a misspelt variable would otherwise be ignored without a word.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from gateway_limiter.config.switch_source import (
    SwitchSourceError,
    need_httpx,
    parse_switch_source,
)
from gateway_limiter.model.calendar import RenewalError, load_zone
from gateway_limiter.observe.logs import log
from gateway_limiter.observe.redact import mask_secrets, mask_url

ENV_PREFIX: Final = "GATEWAY_LIMITER_"
SETTINGS_ENV: Final = ENV_PREFIX + "SETTINGS"
POLICIES: Final = ("share", "local", "allow", "deny")
REDIS_SCHEMES: Final = (
    "redis",
    "rediss",
    "unix",
    "redis+cluster",
    "redis+sentinel",
    "memory",
)


class SettingsError(ValueError):
    """A setting has a bad value, an unknown key, or the settings file cannot be read.

    The message names the key and the value, passwords masked. The command line exits
    2 on it.
    """


@dataclass(frozen=True, slots=True, repr=False)
class Settings:
    """Every setting of the limiter, validated when built; immutable.

    Each field is a key of ``settings.toml`` and a ``GATEWAY_LIMITER_<KEY>`` variable,
    and a keyword of ``GatewayLimiter(...)``; every key, its default and meaning are in
    the settings reference. Its repr masks passwords, so logging one never shows them.

    Raises:
        SettingsError: a value is out of range or of the wrong kind (naming the key).

    Example:
        ```python
        settings = Settings(database_url="mysql+pymysql://gw:secret@db/gateway",
                            redis_url="redis://redis:6379/0", reload_interval=5)
        settings.replace(on_backend_error="deny")   # a validated copy
        ```
    """

    database_url: str = "sqlite:///gateway_limiter.db"
    redis_url: str = "memory://"
    key_prefix: str = "gwl"
    reload_interval: float = 10.0
    switch: bool = True
    #: Where the switch comes from: ``table`` (the switch row, then ``switch``), or a key
    #: in etcd (``etcd://host:port/key``) or Apollo (``apollo://host:port/app/ns?key=K``).
    switch_source: str = "table"
    default_cache: float = 0.5
    #: The IANA zone of calendar quotas whose ``timeZone`` is NULL.
    default_time_zone: str = "UTC"
    #: A paced calendar quota's burst when its row has no maxPermits (permits).
    quota_pacing_burst: int = 10
    #: The used fractions of a calendar quota's period told in a warning (comma-separated).
    quota_warn_at: str = "0.8,0.95"
    #: Seconds between checkpoints of calendar quotas' counters to the database, so a
    #: Redis that comes back without them resumes from there (``core/quotas.py``).
    quota_checkpoint_s: float = 5.0
    on_backend_error: str = "share"
    redis_timeout: float = 0.05
    redis_connect_timeout: float = 0.5
    #: A read deadline that follows the round trips seen goes up to this (s; at or below
    #: redis_timeout: a fixed redis_timeout), so a busy host is not taken for an outage.
    redis_timeout_ceiling: float = 0.2
    #: Connections kept for decisions; threads beyond this wait at most redis_timeout.
    redis_pool_size: int = 64
    #: After a Redis failure, decide by ``on_backend_error`` for this long, then probe.
    breaker_seconds: float = 1.0
    #: Record Prometheus metrics when prometheus-client is installed (gateway_limiter.metrics).
    metrics: bool = True
    #: Seconds between heartbeats of this process's fleet membership in Redis.
    fleet_heartbeat: float = 1.0
    #: Processes in the fleet, for ``share`` before Redis has ever answered (0: unknown).
    fleet_size: int = 0
    #: Seconds a slot (``limiter.slot``) is leased for: a process that dies holding one
    #: loses it this long after its last renewal (a live process renews every third of it).
    slot_lease: float = 10.0

    #: Record changes made with plain SQL in the audit table as reloads find them.
    audit_sql_changes: bool = True
    #: The console's write token (``Authorization: Bearer``); "" : the console is read only.
    console_token: str = ""
    #: Names the console answers to besides the address it listens on (comma-separated;
    #: the names a proxy in front of it forwards in ``Host``).
    console_hosts: str = ""
    #: Envoy's rate limit service (``gateway-limiter rls``): the descriptor entry whose
    #: value is the interfaceUrl, and the one whose value is the caller key.
    rls_interface_entry: str = "interface"
    rls_caller_entry: str = "caller"
    #: True: a request's domain names the channelType whose interfaces it limits.
    rls_domain_channel: bool = False

    def __post_init__(self) -> None:
        _validate(self)

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` applied (validated the same way)."""
        for key in changes:
            if key not in _FIELDS:
                raise TypeError(f"unknown setting {key!r}; {key_hint(key)}")
        coerced = {k: float(v) if _is_float_field(k, v) else v for k, v in changes.items()}
        return dataclasses.replace(self, **coerced)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.masked().items())
        return f"Settings({shown})"

    def masked(self) -> dict[str, Any]:
        """The settings as a dict fit for logs and ``status``: no password shown."""
        return {
            k: _SECRET_SHOWN if k in _SECRET_KEYS and v else mask_url(v) if k in _URL_KEYS else v
            for k, v in dataclasses.asdict(self).items()
        }


_FIELDS: Final = {f.name: f for f in dataclasses.fields(Settings)}
#: Settings whose value is one URL, masked exactly (``mask_url``).
_URL_KEYS: Final = ("database_url", "redis_url", "switch_source")
#: Settings that are secrets: shown as ``_SECRET_SHOWN`` when set, never as they are.
_SECRET_KEYS: Final = ("console_token",)
_SECRET_SHOWN: Final = "***"


def _bad(key: str, value: object, why: str) -> SettingsError:
    if key in _SECRET_KEYS:  # whatever its type: a secret written as a number is one too
        return SettingsError(f"setting {key}={_SECRET_SHOWN}: {why}")
    if isinstance(value, str):
        shown = mask_url(value) if key in _URL_KEYS else mask_secrets(value)
    else:
        shown = repr(value)
    return SettingsError(f"setting {key}={shown!s}: {why}")


def _validate(s: Settings) -> None:
    for key in _FIELDS:
        value = getattr(s, key)
        expected = _FIELDS[key].type
        if expected in ("float", float) and not (
            isinstance(value, (int, float)) and not isinstance(value, bool)
        ):
            raise _bad(key, value, "must be a number")
        if expected in ("int", int) and (not isinstance(value, int) or isinstance(value, bool)):
            raise _bad(key, value, "must be a whole number")
        if expected in ("bool", bool) and not isinstance(value, bool):
            raise _bad(key, value, "must be true or false")
        if expected in ("str", str) and not isinstance(value, str):
            raise _bad(key, value, "must be a string")
    if "://" not in s.database_url:
        raise _bad(
            "database_url", s.database_url, "must be a SQLAlchemy URL such as sqlite:///x.db"
        )
    scheme = s.redis_url.split("://", 1)[0].lower() if "://" in s.redis_url else ""
    if scheme not in REDIS_SCHEMES:
        raise _bad("redis_url", s.redis_url, f"scheme must be one of {', '.join(REDIS_SCHEMES)}")
    try:
        need_httpx(parse_switch_source(s.switch_source))  # its extra: checked at start
    except SwitchSourceError as e:
        raise SettingsError(str(e)) from None
    if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,32}", s.key_prefix):
        raise _bad("key_prefix", s.key_prefix, "must be 1-32 of letters, digits, _ . : -")
    if s.on_backend_error not in POLICIES:
        raise _bad("on_backend_error", s.on_backend_error, f"must be one of {', '.join(POLICIES)}")
    _positive("reload_interval", s.reload_interval, low=0.05)
    _positive("redis_timeout", s.redis_timeout, low=0.001)
    _positive("redis_connect_timeout", s.redis_connect_timeout, low=0.001)
    _positive("redis_timeout_ceiling", s.redis_timeout_ceiling, low=0.001)
    _positive("breaker_seconds", s.breaker_seconds, low=0.0)
    if not (math.isfinite(s.quota_checkpoint_s) and 0.05 <= s.quota_checkpoint_s <= 3600):
        raise _bad(
            "quota_checkpoint_s", s.quota_checkpoint_s, "must be between 0.05 and 3600 seconds"
        )
    if not (math.isfinite(s.default_cache) and 0 <= s.default_cache <= 9.99):
        raise _bad("default_cache", s.default_cache, "must be between 0 and 9.99 seconds")
    try:
        load_zone(s.default_time_zone)
    except RenewalError:
        raise _bad(
            "default_time_zone", s.default_time_zone, "must be an IANA time zone (e.g. UTC)"
        ) from None
    if not 1 <= s.quota_pacing_burst <= 1_000_000_000:
        raise _bad("quota_pacing_burst", s.quota_pacing_burst, "must be between 1 and 1000000000")
    try:
        warn_fractions(s.quota_warn_at)
    except ValueError as e:
        raise _bad("quota_warn_at", s.quota_warn_at, str(e)) from None
    if not 1 <= s.redis_pool_size <= 10_000:
        raise _bad("redis_pool_size", s.redis_pool_size, "must be between 1 and 10000")
    if not (math.isfinite(s.fleet_heartbeat) and 0.05 <= s.fleet_heartbeat <= 3600):
        raise _bad("fleet_heartbeat", s.fleet_heartbeat, "must be between 0.05 and 3600 seconds")
    token = s.console_token
    if token and (len(token) < 16 or token != token.strip()):
        # Never quote the token, not even masked: its length is all the error says.
        raise SettingsError(
            f"setting console_token: must be at least 16 characters without surrounding "
            f"spaces (it has {len(token)})"
        )
    for name in console_host_names(s.console_hosts):
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\]", name):
            raise _bad(
                "console_hosts",
                s.console_hosts,
                f"{name!r} is not a host name (comma-separated names, no ports)",
            )
    if not 0 <= s.fleet_size <= 100_000:
        raise _bad("fleet_size", s.fleet_size, "must be between 0 (unknown) and 100000")
    if not (math.isfinite(s.slot_lease) and 0.1 <= s.slot_lease <= 3600):
        raise _bad("slot_lease", s.slot_lease, "must be between 0.1 and 3600 seconds")
    for key in ("rls_interface_entry", "rls_caller_entry"):
        if not re.fullmatch(r"[\x21-\x7e]{1,64}", getattr(s, key)):
            raise _bad(key, getattr(s, key), "must be 1-64 printable characters, no spaces")
    if s.rls_interface_entry == s.rls_caller_entry:
        raise _bad("rls_caller_entry", s.rls_caller_entry, "must differ from rls_interface_entry")


def warn_fractions(text: str) -> tuple[float, ...]:
    """The ``quota_warn_at`` setting's fractions, ascending (ValueError saying why not)."""
    out: list[float] = []
    for part in text.split(","):
        if not part.strip():
            continue
        try:
            value = float(part)
        except ValueError:
            raise ValueError(f"{part.strip()!r} is not a number") from None
        if not (math.isfinite(value) and 0 < value <= 1):
            raise ValueError(f"{part.strip()} must be above 0 and at most 1")
        out.append(value)
    return tuple(sorted(set(out)))


def console_host_names(text: str) -> list[str]:
    """The names of the ``console_hosts`` setting, in lower case."""
    return [name.strip().lower() for name in text.split(",") if name.strip()]


def _positive(key: str, value: float, *, low: float) -> None:
    if not (math.isfinite(value) and value >= low):
        raise _bad(key, value, f"must be a number >= {low}")


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _from_text(key: str, text: str) -> object:
    """Turn an environment variable's text into the type of setting ``key``."""
    kind = _FIELDS[key].type
    if kind in ("bool", bool):
        low = text.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise _bad(key, text, "must be true or false")
    if kind in ("float", float):
        try:
            return float(text)
        except ValueError:
            raise _bad(key, text, "must be a number") from None
    if kind in ("int", int):
        try:
            return int(text)
        except ValueError:
            raise _bad(key, text, "must be a whole number") from None
    return text


def _read_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise SettingsError(f"settings file {path} does not exist") from None
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise SettingsError(f"settings file {path} cannot be read: {e}") from None
    # Accept keys at the top level or under a [gateway_limiter] table.
    section = data.get("gateway_limiter", data)
    if not isinstance(section, dict):
        raise SettingsError(f"settings file {path}: [gateway_limiter] must be a table")
    return {k: v for k, v in section.items() if k != "gateway_limiter"}


def settings_path(path: str | os.PathLike[str] | None, environ: Mapping[str, str]) -> Path | None:
    """The settings file that applies: ``path``, $GATEWAY_LIMITER_SETTINGS, ./settings.toml."""
    if path is not None:
        return Path(path)
    if environ.get(SETTINGS_ENV):
        return Path(environ[SETTINGS_ENV])
    local = Path("settings.toml")
    return local if local.is_file() else None


def load_settings(
    path: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    base: Settings | None = None,
    **overrides: Any,
) -> Settings:
    """Load settings: ``base`` (or the defaults), then the file, the environment, and
    ``overrides``, each overriding the one before.

    An unknown ``GATEWAY_LIMITER_*`` variable is a warning naming the nearest valid one.

    Args:
        path: the settings file; None: ``$GATEWAY_LIMITER_SETTINGS``, else
            ``./settings.toml`` when it exists, else none.
        environ: the environment to read; default ``os.environ``.
        base: the settings to start from; default the built-in defaults.
        **overrides: settings by name, applied last.

    Returns:
        The validated settings.

    Raises:
        SettingsError: an unknown key in the file or the overrides, a bad value, or a
            file that cannot be read (each naming the key or the file).

    Example:
        ```python
        settings = load_settings("settings.toml", reload_interval=5)
        ```
    """
    env = os.environ if environ is None else environ
    values: dict[str, Any] = dataclasses.asdict(base) if base is not None else {}
    file = settings_path(path, env)
    if file is not None:
        for key, value in _read_file(file).items():
            if key not in _FIELDS:
                raise SettingsError(f"settings file {file}: unknown key {key!r}; {key_hint(key)}")
            values[key] = float(value) if _is_float_field(key, value) else value
    for key in _FIELDS:
        text = env.get(ENV_PREFIX + key.upper())
        if text is not None:
            values[key] = _from_text(key, text)
    for name in unknown_env_names(env):
        _warn_unknown_env(name)
    for key, value in overrides.items():
        if key not in _FIELDS:
            raise TypeError(f"unknown setting {key!r}; {key_hint(key)}")
        if value is not None:
            values[key] = float(value) if _is_float_field(key, value) else value
    return Settings(**values)


#: Every variable name ``load_settings`` reads.
ENV_NAMES: Final = frozenset({SETTINGS_ENV} | {ENV_PREFIX + key.upper() for key in _FIELDS})


def unknown_env_names(environ: Mapping[str, str]) -> list[str]:
    """The ``GATEWAY_LIMITER_*`` variables in ``environ`` that name no setting, sorted.

    A misspelt key in the file or a keyword is an error; a misspelt variable cannot be
    (the environment is shared with everything else the process runs), so it is warned
    about instead of being ignored without a word.
    """
    return sorted(n for n in environ if n.startswith(ENV_PREFIX) and n not in ENV_NAMES)


def _warn_unknown_env(name: str) -> None:
    log.warning("%s", unknown_env_message(name))


def unknown_env_message(name: str) -> str:
    """What is said of the unknown variable ``name``: that it is ignored, and the nearest
    variable that is read (or all of them when none is near)."""
    # Compared without the prefix they all share, which would make any two look alike.
    keys = sorted(n.removeprefix(ENV_PREFIX) for n in ENV_NAMES)
    nearest = difflib.get_close_matches(name.removeprefix(ENV_PREFIX), keys, n=1, cutoff=0.6)
    if nearest:
        hint = f"did you mean {ENV_PREFIX}{nearest[0]}?"
    else:
        hint = f"the variables read are {', '.join(sorted(ENV_NAMES))}"
    return f"environment variable {name} is not a setting and is ignored; {hint}"


def key_hint(key: str) -> str:
    """What to say of the unknown setting ``key``: the nearest key (as a misspelt
    variable gets), or every key when none is near."""
    keys = sorted(_FIELDS)
    nearest = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    if nearest:
        return f"did you mean {nearest[0]!r}?"
    return f"the keys are {', '.join(keys)}"


def _is_float_field(key: str, value: object) -> bool:
    # TOML and callers write 10 for 10.0; accept whole numbers where a float is meant.
    return _FIELDS[key].type in ("float", float) and type(value) is int
