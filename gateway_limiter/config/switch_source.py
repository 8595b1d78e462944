"""Where the global switch comes from (setting ``switch_source``): the table, etcd, Apollo.

How it works: docs/internals.md, section ``gateway_limiter.config.switch_source``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final
from urllib.parse import parse_qs, quote, unquote

from gateway_limiter.observe.logs import log, one_line
from gateway_limiter.observe.redact import mask_url

if TYPE_CHECKING:
    import httpx

TABLE: Final = "table"
ETCD: Final = "etcd"
APOLLO: Final = "apollo"
#: The URL schemes of a configuration centre; the ``s`` ones speak TLS.
SCHEMES: Final = {"etcd": ETCD, "etcds": ETCD, "apollo": APOLLO, "apollos": APOLLO}
DEFAULT_PORTS: Final = {ETCD: 2379, APOLLO: 8080}

#: The values a key may hold (any case, surrounding spaces ignored).
ON_VALUES: Final = frozenset({"on", "true", "1", "y"})
OFF_VALUES: Final = frozenset({"off", "false", "0", "n"})

#: How long ``start`` waits for the first reading before the process goes on without it.
FIRST_READING_WAIT_S: Final = 2.0
#: Connect timeout, and the longest wait for a reply that is not a held long poll.
REQUEST_TIMEOUT_S: Final = 3.0
#: A watch stream silent this long is opened again (a half-open connection ends so).
WATCH_IDLE_S: Final = 60.0
#: Apollo holds a notification poll up to 60 s; the client waits a little longer.
APOLLO_POLL_TIMEOUT_S: Final = 90.0
#: Retries after a failure: first after this long, doubling up to RETRY_MAX_S.
RETRY_MIN_S: Final = 0.1
RETRY_MAX_S: Final = 0.5

_TLS_OPTIONS: Final = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")


class SwitchSourceError(ValueError):
    """A ``switch_source`` that cannot be used (bad form, or its extra not installed)."""


class SourceUnreachable(Exception):
    """The source did not answer as it should (the watcher keeps the last good state)."""


class BadSwitchValue(ValueError):
    """A key's value that is not on/off."""


def switch_value(text: str) -> bool:
    """``text`` as on (True) or off (False); ``BadSwitchValue`` when it is neither."""
    low = text.strip().lower()
    if low in ON_VALUES:
        return True
    if low in OFF_VALUES:
        return False
    raise BadSwitchValue(text)


@dataclass(frozen=True, slots=True)
class SwitchSource:
    """A parsed ``switch_source``: where the switch is read and how."""

    kind: str  # TABLE, ETCD or APOLLO
    url: str = ""
    hosts: tuple[tuple[str, int], ...] = ()
    tls: bool = False
    user: str = ""
    password: str = field(default="", repr=False)
    #: etcd: the key; Apollo: the configuration's name within its namespace.
    key: str = ""
    app_id: str = ""
    namespace: str = ""
    cluster: str = "default"
    ssl_ca_certs: str = ""
    ssl_certfile: str = ""
    ssl_keyfile: str = ""

    @property
    def external(self) -> bool:
        """True for a configuration centre, False for the table."""
        return self.kind != TABLE

    @property
    def shown(self) -> str:
        """The URL as logs and commands show it (password masked)."""
        return mask_url(self.url) if self.external else TABLE

    def bases(self) -> list[str]:
        """One base URL per host, in the order given."""
        scheme = "https" if self.tls else "http"
        return [f"{scheme}://{_host(h)}:{p}" for h, p in self.hosts]

    def where_to_change(self) -> str:
        """Where an operator changes the switch, in words (for the CLI and the console)."""
        if self.kind == ETCD:
            endpoints = ",".join(self.bases())
            return f"set it in etcd: etcdctl --endpoints={endpoints} put {_shell(self.key)} on|off"
        if self.kind == APOLLO:
            return (
                f"set it in Apollo: key {self.key} of namespace {self.namespace}, app "
                f"{self.app_id}, cluster {self.cluster}, to on or off, and release"
            )
        return "gateway-limiter switch on|off|default"


TABLE_SOURCE: Final = SwitchSource(TABLE)


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _shell(word: str) -> str:
    return word if word and all(c.isalnum() or c in "/_.-:" for c in word) else repr(word)


def parse_switch_source(text: str) -> SwitchSource:
    """Parse ``switch_source``; ``SwitchSourceError`` says what is wrong (password masked).

    ``table``; ``etcd://[user:password@]host:port[,host:port...]/key`` (``etcds://``:
    TLS, with ``?ssl_ca_certs=&ssl_certfile=&ssl_keyfile=`` as for Redis URLs); a key
    that itself begins with "/" is written after a second slash (``etcd://h:2379//a/b``).
    ``apollo://host:port/appId/namespace?key=NAME[&cluster=default]`` (``apollos://``:
    TLS).
    """
    if text.strip().lower() == TABLE:
        return TABLE_SOURCE
    head, sep, rest = text.partition("://")
    kind = SCHEMES.get(head.lower()) if sep else None
    if kind is None:
        raise _bad(text, "must be table, etcd://host:port/key or apollo://host:port/app/ns?key=K")
    rest, _, query_text = rest.partition("?")
    authority, slash, path = rest.partition("/")
    userinfo, at, hostlist = authority.rpartition("@")
    user, _, password = userinfo.partition(":") if at else ("", "", "")
    hosts = tuple(_host_port(text, h, DEFAULT_PORTS[kind]) for h in hostlist.split(","))
    try:
        query = parse_qs(query_text, keep_blank_values=True, strict_parsing=bool(query_text))
    except ValueError:
        raise _bad(text, "its query is not name=value pairs joined by &") from None
    options = {k: v[-1] for k, v in query.items()}
    tls = head.lower().endswith("s")
    tls_options = {k: options.pop(k) for k in _TLS_OPTIONS if k in options}
    if tls_options and not tls:
        raise _bad(text, f"TLS options need the {head.lower()}s:// scheme")
    common = SwitchSource(
        kind,
        url=text,
        hosts=hosts,
        tls=tls,
        user=unquote(user),
        password=unquote(password),
        ssl_ca_certs=tls_options.get("ssl_ca_certs", ""),
        ssl_certfile=tls_options.get("ssl_certfile", ""),
        ssl_keyfile=tls_options.get("ssl_keyfile", ""),
    )
    if kind == ETCD:
        key = unquote(path) if slash else ""
        if not key:
            raise _bad(text, "names no key: etcd://host:port/key")
        if options:
            raise _bad(text, f"unknown option {sorted(options)[0]!r}")
        return dataclasses.replace(common, key=key)
    parts = [unquote(p) for p in path.split("/")] if slash else []
    if len(parts) != 2 or not all(parts):
        raise _bad(text, "must name an app and a namespace: apollo://host:port/appId/namespace")
    key = options.pop("key", "")
    cluster = options.pop("cluster", "default") or "default"
    if not key:
        raise _bad(text, "names no key: add ?key=NAME")
    if options:
        raise _bad(text, f"unknown option {sorted(options)[0]!r}")
    if user:
        raise _bad(text, "Apollo's config service takes no user:password")
    return dataclasses.replace(
        common, key=key, app_id=parts[0], namespace=parts[1], cluster=cluster
    )


def _bad(text: str, why: str) -> SwitchSourceError:
    return SwitchSourceError(f"setting switch_source={mask_url(text)}: {why}")


def _host_port(text: str, item: str, default: int) -> tuple[str, int]:
    item = item.strip()
    if item.startswith("["):
        host, _, tail = item[1:].partition("]")
        port_text = tail.removeprefix(":")
    else:
        host, _, port_text = item.partition(":")
    if not host:
        raise _bad(text, "names no host")
    if not port_text:
        return host, default
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise _bad(text, f"port {port_text!r} is not a port number")
    return host, int(port_text)


def need_httpx(source: SwitchSource) -> None:
    """``SwitchSourceError`` unless httpx (the extra of ``source``'s kind) is installed."""
    import importlib.util

    if source.external and importlib.util.find_spec("httpx") is None:
        raise SwitchSourceError(
            f"setting switch_source={source.shown}: needs httpx: "
            f"pip install 'gateway-limiter[{source.kind}]'"
        )


# --- what a reading means ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reading:
    """What the source holds: the key's text (None: no such key) and its version (etcd's
    mod_revision, Apollo's releaseKey), which the audit uses to record a change once."""

    text: str | None
    version: str = ""


#: ``on_change(enabled, origin, reading)``: origin is the source's kind, or "settings".
OnChange = Callable[[bool, str, Reading | None], None]


class SwitchFollower:
    """The switch as the source last said it, and what each event does to it.

    No I/O: the watcher calls ``seen`` with each reading and ``lost`` with each failure;
    the follower logs (one error per outage, one warning per bad value or missing key)
    and calls ``on_change`` when the state or its origin changes.
    """

    def __init__(self, source: SwitchSource, default: bool, on_change: OnChange) -> None:
        self.source = source
        self.default = default
        self.enabled = default
        #: "settings" until the source has said on or off, then the source's kind.
        self.origin = "settings"
        self.reached = False
        self.down = False
        self._on_change = on_change
        self._bad: str | None = None
        self._missing = False
        self._first = True  # no reading yet
        self._lock = threading.Lock()

    def seen(self, reading: Reading) -> None:
        """The source answered with ``reading``."""
        where = self.source.shown
        with self._lock:
            if self.down:
                log.warning("switch source %s reachable again", where)
            self.down = False
            self.reached = True
            if reading.text is None:
                self._bad = None
                if not self._missing:
                    log.warning(
                        "switch key %r not found at %s: the switch setting applies (%s)",
                        self.source.key,
                        where,
                        _on_off(self.default),
                    )
                self._missing = True
                return self._set(self.default, "settings", reading)
            self._missing = False
            try:
                enabled = switch_value(reading.text)
            except BadSwitchValue:
                if reading.text != self._bad:
                    log.warning(
                        "switch value %r at %s is not on/off (on, off, true, false, 1, 0, Y, "
                        "N); keeping the switch %s",
                        one_line(reading.text, 80),
                        where,
                        _on_off(self.enabled),
                    )
                self._bad = reading.text
                return None
            self._bad = None
            return self._set(enabled, self.source.kind, reading)

    def lost(self, error: BaseException | str) -> None:
        """The source could not be read: keep the state, say so once per outage."""
        with self._lock:
            reason = one_line(str(error) or type(error).__name__)
            if self.down:
                log.debug("switch source %s still unreachable: %s", self.source.shown, reason)
                return
            self.down = True
            if self.reached:
                log.error(
                    "switch source %s unreachable (%s); keeping the last good state: switch %s",
                    self.source.shown,
                    reason,
                    _on_off(self.enabled),
                )
            else:
                log.error(
                    "switch source %s never reached (%s); starting from the switch setting: "
                    "switch %s",
                    self.source.shown,
                    reason,
                    _on_off(self.enabled),
                )

    def _set(self, enabled: bool, origin: str, reading: Reading) -> None:
        if enabled == self.enabled and origin == self.origin:
            self._first = False
            return
        if self._first:  # a process starting: no turn, just where it stands
            log.info("global switch %s at %s", _on_off(enabled), self.source.shown)
        elif enabled != self.enabled:
            log.warning("global switch turned %s at %s", _on_off(enabled), self.source.shown)
        self.enabled, self.origin, self._first = enabled, origin, False
        self._on_change(enabled, origin, reading)


def _on_off(enabled: bool) -> str:
    return "on" if enabled else "off"


# --- reading the sources --------------------------------------------------------------------


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode("ascii")


def _unb64(text: str) -> str:
    return base64.b64decode(text).decode("utf-8", errors="replace")


async def _etcd_headers(
    client: httpx.AsyncClient, source: SwitchSource, base: str
) -> dict[str, str]:
    if not source.user:
        return {}
    reply = await client.post(
        f"{base}/v3/auth/authenticate", json={"name": source.user, "password": source.password}
    )
    body = _json_reply(reply, "authenticate")
    token = body.get("token")
    if not isinstance(token, str):
        raise SourceUnreachable(f"authenticate: {body.get('message') or 'no token'}")
    return {"Authorization": token}


def _json_reply(reply: httpx.Response, what: str) -> dict[str, object]:
    if reply.status_code != 200:
        text = one_line(reply.text, 120)
        raise SourceUnreachable(f"{what}: HTTP {reply.status_code} {text}")
    try:
        body = reply.json()
    except ValueError:
        raise SourceUnreachable(f"{what}: not JSON") from None
    if not isinstance(body, dict):
        raise SourceUnreachable(f"{what}: not a JSON object")
    return body


def _etcd_reading(kvs: object) -> Reading:
    if isinstance(kvs, list) and kvs and isinstance(kvs[0], dict):
        kv = kvs[0]
        return Reading(_unb64(str(kv.get("value", ""))), str(kv.get("mod_revision", "")))
    return Reading(None)


async def etcd_range(
    client: httpx.AsyncClient, source: SwitchSource, base: str, headers: dict[str, str]
) -> tuple[Reading, int]:
    """The key's value now, and the revision of the store it was read at."""
    reply = await client.post(
        f"{base}/v3/kv/range", json={"key": _b64(source.key)}, headers=headers
    )
    body = _json_reply(reply, "range")
    header = body.get("header")
    revision = int(header.get("revision", 0)) if isinstance(header, dict) else 0
    return _etcd_reading(body.get("kvs")), revision


async def follow_etcd(
    client: httpx.AsyncClient, source: SwitchSource, base: str
) -> AsyncIterator[Reading]:
    """Read the key, then yield each change the watch stream brings; returns when the
    stream has been idle ``WATCH_IDLE_S`` (the caller opens it again)."""
    import httpx

    headers = await _etcd_headers(client, source, base)
    reading, revision = await etcd_range(client, source, base, headers)
    yield reading
    request = {"create_request": {"key": _b64(source.key), "start_revision": revision + 1}}
    timeout = httpx.Timeout(REQUEST_TIMEOUT_S, read=WATCH_IDLE_S)
    try:
        async with client.stream(
            "POST", f"{base}/v3/watch", json=request, headers=headers, timeout=timeout
        ) as stream:
            if stream.status_code != 200:
                await stream.aread()
                raise SourceUnreachable(f"watch: HTTP {stream.status_code}")
            async for line in stream.aiter_lines():
                if not line.strip():
                    continue
                message = json.loads(line)
                if "error" in message:
                    raise SourceUnreachable(f"watch: {message['error'].get('message', message)}")
                result = message.get("result", {})
                if result.get("canceled") or result.get("compact_revision"):
                    raise SourceUnreachable(f"watch canceled: {result.get('cancel_reason', '')}")
                for event in result.get("events", ()):
                    kv = event.get("kv", {})
                    if event.get("type") == "DELETE":
                        yield Reading(None, str(kv.get("mod_revision", "")))
                    else:
                        yield _etcd_reading([kv])
    except httpx.ReadTimeout:
        return  # idle: the caller reads the key again and watches anew
    raise SourceUnreachable("watch stream ended")


async def apollo_config(client: httpx.AsyncClient, source: SwitchSource, base: str) -> Reading:
    """``GET /configs/{appId}/{cluster}/{namespace}``: the key's value (None: absent)."""
    path = "/".join(quote(p, safe="") for p in (source.app_id, source.cluster, source.namespace))
    reply = await client.get(f"{base}/configs/{path}")
    if reply.status_code == 404:
        return Reading(None)
    body = _json_reply(reply, "configs")
    configurations = body.get("configurations")
    if not isinstance(configurations, dict):
        raise SourceUnreachable("configs: no configurations in the reply")
    value = configurations.get(source.key)
    return Reading(None if value is None else str(value), str(body.get("releaseKey", "")))


async def follow_apollo(
    client: httpx.AsyncClient, source: SwitchSource, base: str
) -> AsyncIterator[Reading]:
    """Read the key, then long-poll ``/notifications/v2`` and read it again on each
    notification for the namespace."""
    import httpx

    notification_id = -1
    timeout = httpx.Timeout(REQUEST_TIMEOUT_S, read=APOLLO_POLL_TIMEOUT_S)
    yield await apollo_config(client, source, base)
    while True:
        notifications = json.dumps(
            [{"namespaceName": source.namespace, "notificationId": notification_id}],
            separators=(",", ":"),
        )
        params = {"appId": source.app_id, "cluster": source.cluster, "notifications": notifications}
        try:
            reply = await client.get(f"{base}/notifications/v2", params=params, timeout=timeout)
        except httpx.ReadTimeout:
            continue
        if reply.status_code == 304:
            continue
        body = reply.json() if reply.status_code == 200 else None
        if not isinstance(body, list):
            raise SourceUnreachable(f"notifications/v2: HTTP {reply.status_code}")
        for item in body:
            if isinstance(item, dict) and item.get("namespaceName") == source.namespace:
                notification_id = int(item.get("notificationId", notification_id))
        # A release (or, on the first poll, the current id at once: a release may have
        # come between the read above and this poll): read the namespace again.
        yield await apollo_config(client, source, base)


def _client(source: SwitchSource) -> httpx.AsyncClient:
    import ssl

    import httpx

    verify: ssl.SSLContext | bool = True
    if source.tls:
        context = ssl.create_default_context(cafile=source.ssl_ca_certs or None)
        if source.ssl_certfile:
            context.load_cert_chain(source.ssl_certfile, source.ssl_keyfile or None)
        verify = context
    return httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, verify=verify, trust_env=False)


def readings(client: httpx.AsyncClient, source: SwitchSource, base: str) -> AsyncIterator[Reading]:
    """The readings of ``source`` through the host at ``base``: its follower's generator."""
    if source.kind == ETCD:
        return follow_etcd(client, source, base)
    return follow_apollo(client, source, base)


async def read_once(source: SwitchSource) -> Reading:
    """One reading of ``source`` (the first host that answers): for the command line."""
    errors: list[str] = []
    async with _client(source) as client:
        for base in source.bases():
            follow = readings(client, source, base)
            try:
                return await anext(follow)
            except Exception as e:  # the next host, then the error
                errors.append(f"{base}: {one_line(str(e) or type(e).__name__)}")
            finally:
                await follow.aclose()  # type: ignore[attr-defined]
    raise SourceUnreachable("; ".join(errors))


class SwitchWatcher:
    """Follows ``source`` for ``follower``: one coroutine, run in a thread or as a task."""

    def __init__(self, follower: SwitchFollower) -> None:
        self.follower = follower
        #: Set after the first reading or failure (the thread's start waits for it).
        self.settled = threading.Event()
        #: Set after the first reading.
        self.reached = threading.Event()
        self._settled_here: asyncio.Event | None = None  # the same, for start_task
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None

    async def follow(self) -> None:
        """Read, watch, and on any failure try the next host; until cancelled. The
        source is unreachable (``SwitchFollower.lost``: the state stays) only once
        every host has failed in a row, and each such round ends with a short pause."""
        source = self.follower.source
        pause = RETRY_MIN_S
        hosts = source.bases()
        at = failed = 0
        async with _client(source) as client:
            while True:
                base = hosts[at % len(hosts)]
                follow = readings(client, source, base)
                try:
                    async for reading in follow:
                        self.follower.seen(reading)
                        failed = 0
                        self.reached.set()
                        self._settle()
                        pause = RETRY_MIN_S
                    continue  # idle, not a failure: open it again at once
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # any failure of the source: keep the state
                    failed += 1
                    if failed < len(hosts):
                        log.debug("switch source %s: %s", source.shown, _reason(base, e))
                    else:
                        self.follower.lost(_reason(base, e))
                        self._settle()
                finally:
                    await follow.aclose()  # type: ignore[attr-defined]
                at += 1
                if failed >= len(hosts):  # every host failed: pause before the next round
                    await asyncio.sleep(pause)
                    pause = min(RETRY_MAX_S, pause * 2)

    def _settle(self) -> None:
        self.settled.set()
        if self._settled_here is not None:
            self._settled_here.set()

    # -- in a thread (GatewayLimiter) --

    def start_thread(self, wait_s: float = FIRST_READING_WAIT_S) -> None:
        """Follow in a daemon thread; wait up to ``wait_s`` for the first reading."""
        if self._thread is not None and self._thread.is_alive():
            self.settled.wait(wait_s)  # following already (a second start)
            return
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._task = loop.create_task(self.follow())
            ready.set()
            try:
                loop.run_until_complete(self._task)
            except asyncio.CancelledError:
                pass
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=run, name="gateway-limiter-switch", daemon=True)
        self._thread.start()
        ready.wait()
        self.settled.wait(wait_s)

    def stop_thread(self) -> None:
        """Stop following (the thread ends within a moment)."""
        thread, loop, task = self._thread, self._loop, self._task
        self._thread = None
        if thread is None or loop is None or task is None:
            return
        if not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # a loop closing in between: done
                loop.call_soon_threadsafe(task.cancel)
        thread.join(5.0)

    # -- as a task (AsyncGatewayLimiter) --

    async def start_task(self, wait_s: float = FIRST_READING_WAIT_S) -> None:
        """Follow as a task on the running loop; wait up to ``wait_s`` for the first
        reading (without blocking the loop)."""
        if self._task is not None and not self._task.done():
            return  # following already (a second start)
        settled = self._settled_here = asyncio.Event()
        self._task = asyncio.create_task(self.follow(), name="gateway-limiter-switch")
        # On a timeout the task goes on; the switch setting applies until it reads.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(settled.wait(), wait_s)

    async def stop_task(self) -> None:
        """Cancel the task and wait for it to end."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    def abandon(self) -> None:
        """Forget a task whose loop is gone (no I/O)."""
        self._task = None


def _reason(base: str, error: BaseException) -> str:
    text = str(error) or type(error).__name__
    if isinstance(error, SourceUnreachable):
        return f"{base}: {text}"
    return f"{base}: {type(error).__name__}: {text}"
