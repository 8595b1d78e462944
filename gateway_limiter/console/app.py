"""The console's ASGI application: the page at ``/``, its assets under ``/static/``, and
the JSON API under ``/api/`` (names fixed in docs/design.md, section "The console").

How it works: docs/internals.md, section ``gateway_limiter.console.app``.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway_limiter.config.audit import SOURCE_CONSOLE, ChangedBy, read_audit, row_record
from gateway_limiter.config.edits import (
    COLUMN_OF,
    FieldError,
    WouldSkip,
    check_values,
    delete_row,
    new_row,
    write_planned,
    written_warnings,
)
from gateway_limiter.config.rules import CHANNEL_URL, read_ruleset, url_shape_problem
from gateway_limiter.config.settings import console_host_names
from gateway_limiter.config.switch_source import (
    BadSwitchValue,
    parse_switch_source,
    read_once,
    switch_value,
)
from gateway_limiter.config.table import (
    ConfRow,
    LockedTable,
    locked_table,
    read_switch,
    write_switch,
)
from gateway_limiter.console.sources import Sources
from gateway_limiter.core.status import BucketStatus, condition
from gateway_limiter.observe.logs import one_line

HERE: Final = Path(__file__).resolve().parent
#: Audit rows one request may ask for.
MAX_AUDIT: Final = 1000
#: The switch of a configuration centre (etcd, Apollo) is read again after this long (s).
CENTRE_MAX_AGE_S: Final = 1.0
#: Headers on every response: the page loads nothing from elsewhere and cannot be framed.
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

Handler = Callable[[Request], Awaitable[Response]]


class ApiError(Exception):
    """An answer other than 2xx: status, message and the field at fault (if one is)."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.field = field


def _json(value: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(value, status_code=status, headers=SECURITY_HEADERS)


def _digits(text: str) -> bool:
    """Whether ``text`` is a whole number written in ASCII digits (``str.isdigit`` is
    also true for '²', which ``int`` refuses)."""
    return text.isascii() and text.isdigit()


def _row_json(row: ConfRow, skipped: dict[int, str]) -> dict[str, Any]:
    shown: dict[str, Any] = {"configId": row.config_id}
    for attr, col in COLUMN_OF.items():
        value = getattr(row, attr, None)
        if isinstance(value, float):
            value = round(value, 2) if attr == "cache" else round(value, 6)
        elif value is not None and not isinstance(value, (int, str)):
            value = repr(value)  # SQLite may hold anything: shown, never trusted
        shown[col] = value
    stamp = row.last_modify_time
    shown["lastModifyTime"] = None if stamp is None else str(stamp)
    shown["skipped"] = skipped.get(row.config_id)
    return shown


def host_allowed(host_header: str, listen_host: str, extra: Sequence[str] = ()) -> bool:
    """Whether a request whose ``Host`` header is ``host_header`` is for this console,
    listening on ``listen_host``: the address it listens on, the names of this machine's
    loopback (``localhost``) when it listens on loopback, any address of this machine
    and its own names when it listens on all of them, and the names in ``extra`` (the
    ``console_hosts`` setting). Anything else is another site's name pointed at this
    address (DNS rebinding): its page must read nothing."""
    name = _host_name(host_header)
    if not name:
        return False
    listen = listen_host.strip("[]").lower()
    if name in extra or name == listen:
        return True
    literal = _address(name)
    if listen in ("", "0.0.0.0", "::"):  # all of this machine's addresses
        own = {socket.gethostname().lower(), socket.getfqdn().lower(), "localhost"}
        return literal is not None or name in own
    listening = _address(listen)
    loopback = listening.is_loopback if listening is not None else listen == "localhost"
    if loopback:
        return name == "localhost" or (literal is not None and literal.is_loopback)
    return literal is not None and literal == listening


def _host_name(header: str) -> str:
    """The name or address of a ``Host`` header, without its port, in lower case."""
    header = header.strip().lower()
    if header.startswith("["):  # [::1]:8088
        end = header.find("]")
        return header[1:end] if end > 0 else ""
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


class _Guard:
    """Around the whole app: a request for another ``Host`` is refused (400) before it
    reaches a route, and every response, an error's too (404, 405, 500), carries the
    security headers."""

    def __init__(self, app: ASGIApp, allowed: Callable[[str], bool]) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        host = headers.get(b"host", b"").decode("latin-1")
        if not self.allowed(host):
            refused = _json({"error": f"this console does not answer to Host {host!r}"}, 400)
            await refused(scope, receive, send)
            return

        async def guarded(message: Message) -> None:
            if message["type"] == "http.response.start":
                have = {k.lower() for k, _ in message.get("headers", [])}
                extra = [
                    (k.lower().encode(), v.encode())
                    for k, v in SECURITY_HEADERS.items()
                    if k.lower().encode() not in have
                ]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, guarded)


def make_app(sources: Sources, listen_host: str = "127.0.0.1") -> ASGIApp:
    """The console over ``sources``, answering requests for ``listen_host`` (the
    address it listens on; see ``host_allowed``)."""
    settings = sources.settings
    token = settings.console_token
    templates = Jinja2Templates(directory=str(HERE / "templates"))

    def authorise(request: Request) -> None:
        if request.method in ("GET", "HEAD"):
            return
        if not token:  # no token can make a write: not a missing credential (401)
            raise ApiError(403, "console_token is not set: this console is read only")
        given = request.headers.get("authorization", "")
        scheme, _, value = given.partition(" ")
        if scheme.lower() != "bearer" or not value:
            raise ApiError(401, "writes need the header 'Authorization: Bearer <console_token>'")
        if not hmac.compare_digest(value.strip().encode(), token.encode()):
            raise ApiError(403, "wrong console token")

    def api(handler: Handler) -> Handler:
        async def run(request: Request) -> Response:
            try:
                authorise(request)
                return await handler(request)
            except ApiError as e:
                body = {"error": str(e)} | ({"field": e.field} if e.field else {})
                return _json(body, e.status)
            except FieldError as e:
                return _json({"error": str(e), "field": e.field}, 422)

        return run

    async def body_of(request: Request) -> dict[str, Any]:
        try:
            value = json.loads(await request.body())
        except ValueError as e:
            raise ApiError(400, f"the body is not JSON: {e}") from None
        if not isinstance(value, dict):
            raise ApiError(400, "the body must be a JSON object of column names and values")
        return value

    def changed_by(request: Request) -> ChangedBy:
        named = request.headers.get("x-actor", "").strip()
        if named:
            return ChangedBy(named[:128], SOURCE_CONSOLE)
        # no name given: say where the request came from, not only who runs the console
        client = request.client.host if request.client else "?"
        return ChangedBy(f"{client} via {sources.actor}"[:128], SOURCE_CONSOLE)

    # --- rules --------------------------------------------------------------------------

    def list_rules() -> dict[str, Any]:
        rows, ruleset = read_ruleset(sources.engine, settings)
        skipped = {s.config_id: s.reason for s in ruleset.skipped}
        return {"rows": [_row_json(r, skipped) for r in rows], "total": len(rows)}

    async def get_rules(request: Request) -> Response:
        return _json(await run_in_threadpool(list_rules))

    def write(
        table: LockedTable,
        old: ConfRow | None,
        after: ConfRow,
        fields: dict[str, Any],
        by: ChangedBy,
    ) -> dict[str, Any]:
        """Write ``after`` (``write_planned``); FieldError/ApiError when it would not be
        limited as meant, and nothing written."""
        try:
            row = write_planned(table, old, after, fields, by, settings.default_cache)
        except WouldSkip as e:
            raise ApiError(422, f"the reload would skip {e}", "algorithm") from None
        return row_record(row)

    def warnings_of(config_id: int) -> list[str]:
        """What the reload will warn about the row just written, read back."""
        rows = read_ruleset(sources.engine, settings)[0]
        return written_warnings(rows, [config_id], settings.default_cache)

    def path_only(values: dict[str, Any]) -> dict[str, Any]:
        """``values`` without ``anyKey``; FieldError when the interfaceUrl they write is
        not a path the integrations decide on and ``anyKey`` does not say it is a key
        callers pass themselves (as ``conf set --any-key``)."""
        values = dict(values)
        any_key = values.pop("anyKey", False) is True
        url = values.get("interfaceUrl")
        shape = url_shape_problem(url) if isinstance(url, str) else ""
        if shape and not any_key:
            raise FieldError("interfaceUrl", f"{shape} (or send anyKey: true: written as is)")
        return values

    def create(values: dict[str, Any], by: ChangedBy) -> dict[str, Any]:
        values = path_only(values)
        for needed in ("interfaceUrl", "rateLimit"):
            if needed not in values:
                raise FieldError(needed, "a new row needs it")
        fields = check_values(values)
        fields.setdefault("status", 0)  # a new row starts disabled, as with conf set
        fields.setdefault("period_seconds", 1)
        fields.setdefault("per_caller", 0)
        channel_cap = fields["interface_url"] == CHANNEL_URL
        if channel_cap and not fields.get("channel_type"):
            raise FieldError("channelType", "a channel cap (interfaceUrl '*') names its channel")
        with locked_table(sources.engine) as table:
            rows = table.rows
            same = [
                r
                for r in rows
                if (r.interface_url, r.period_seconds, r.per_caller, r.caller_key)
                == (
                    fields["interface_url"],
                    fields["period_seconds"],
                    fields["per_caller"],
                    fields.get("caller_key"),
                )
                # each channel has its own cap row
                and (not channel_cap or r.channel_type == fields["channel_type"])
            ]
            if same:
                raise ApiError(
                    409,
                    f"configId {same[0].config_id} is already the row of this URL, period "
                    "and scope: change it with PATCH /api/rules/{configId}",
                    "interfaceUrl",
                )
            made = write(table, None, replace(new_row(rows), **fields), fields, by)
        # the row as before, and what the reload will warn about it, as a PATCH answers:
        # a row added beside a leased one (or a channel cap over it) makes its lease ignored
        return made | {"warnings": warnings_of(made["configId"])}

    async def post_rule(request: Request) -> Response:
        values = await body_of(request)
        by = changed_by(request)
        return _json(await run_in_threadpool(create, values, by), 201)

    def config_id_of(request: Request) -> int:
        text = request.path_params["config_id"]
        if not _digits(text) or len(text) > 10:
            raise ApiError(404, f"no row with configId {text!r}", "configId")
        return int(text)

    def change(config_id: int, values: dict[str, Any], by: ChangedBy) -> dict[str, Any]:
        values = path_only(values)
        if not values:
            raise ApiError(400, "nothing to change: give columns and their new values")
        fields = check_values(values)
        # checked against the row as it is in the transaction that writes it: a change
        # another session makes meanwhile waits for this one, or this one for it
        with locked_table(sources.engine) as table:
            current = next((r for r in table.rows if r.config_id == config_id), None)
            if current is None:
                raise ApiError(404, f"no row with configId {config_id}", "configId")
            before = row_record(current)
            after = write(table, current, replace(current, **fields), fields, by)
        # what the reload will warn about this row (a leaseMs it ignores), as conf set says
        return {"before": before, "after": after, "warnings": warnings_of(config_id)}

    async def patch_rule(request: Request) -> Response:
        config_id = config_id_of(request)
        values = await body_of(request)
        by = changed_by(request)
        return _json(await run_in_threadpool(change, config_id, values, by))

    def remove(config_id: int, by: ChangedBy) -> dict[str, Any]:
        with locked_table(sources.engine) as table:
            current = next((r for r in table.rows if r.config_id == config_id), None)
            if current is None:
                raise ApiError(404, f"no row with configId {config_id}", "configId")
            delete_row(table, current, by)
            return row_record(current)

    async def delete_rule(request: Request) -> Response:
        config_id = config_id_of(request)
        gone = await run_in_threadpool(remove, config_id, changed_by(request))
        return _json({"deleted": gone})

    # --- switch -------------------------------------------------------------------------

    centre = parse_switch_source(settings.switch_source)
    centre_read: list[tuple[float, dict[str, Any]]] = []  # the last reading, and when

    def centre_now() -> dict[str, Any]:
        """The switch as the configuration centre holds it (read at most once a second:
        every open page asks every second)."""
        if centre_read and time.monotonic() - centre_read[0][0] < CENTRE_MAX_AGE_S:
            return centre_read[0][1]
        shown: dict[str, Any] = {
            "enabled": None,
            "effective": None,
            "source": centre.kind,
            "where": centre.shown,
            "change": centre.where_to_change(),
            "value": None,
            "error": None,
        }
        try:
            reading = asyncio.run(read_once(centre))
        except Exception as e:  # unreachable, or httpx missing: said on the page
            shown["error"] = one_line(str(e) or type(e).__name__)
        else:
            shown["value"] = reading.text
            try:
                shown["effective"] = (
                    settings.switch if reading.text is None else switch_value(reading.text)
                )
            except BadSwitchValue:
                shown["error"] = f"{reading.text!r} is not on/off: processes keep the last good"
        centre_read[:] = [(time.monotonic(), shown)]
        return shown

    def switch_now() -> dict[str, Any]:
        if centre.external:
            return centre_now()
        stored = read_switch(sources.engine)
        return {
            "enabled": stored,
            "effective": settings.switch if stored is None else stored,
            "source": "settings" if stored is None else "database",
        }

    async def get_switch(request: Request) -> Response:
        return _json(await run_in_threadpool(switch_now))

    async def put_switch(request: Request) -> Response:
        values = await body_of(request)
        if set(values) != {"enabled"} or values["enabled"] not in (True, False, None):
            raise ApiError(422, 'the body must be {"enabled": true | false | null}', "enabled")
        if values["enabled"] is not None and not isinstance(values["enabled"], bool):
            raise ApiError(422, 'the body must be {"enabled": true | false | null}', "enabled")
        if centre.external:
            raise ApiError(
                409,
                f"the switch is kept in {centre.kind} {centre.shown} (setting switch_source), "
                f"not in the table: {centre.where_to_change()}",
            )
        by = changed_by(request)
        await run_in_threadpool(write_switch, sources.engine, values["enabled"], by)
        return _json(await run_in_threadpool(switch_now))

    # --- live ---------------------------------------------------------------------------

    def quota_json(b: BucketStatus) -> dict[str, Any] | None:
        """A calendar quota's period as the page draws it (its burn-down): when it
        started and renews (Unix s), the permits used of its limit, and its zone."""
        calendar = b.rule.calendar
        if calendar is None or b.quota_used is None or b.renews_at is None:
            return None
        starts_at, _ = calendar.period_at(b.renews_at - 1)
        return {
            "period": calendar.renewal.period.value,
            "timeZone": calendar.zone.key,
            "used": round(b.quota_used),
            "limit": b.rule.rate,
            "startsAt": starts_at,
            "renewsAt": b.renews_at,
            "pacing": b.rule.pacing,
            "pacingBurst": b.rule.pace_burst if b.rule.pacing else None,
        }

    def status_now() -> dict[str, Any]:
        buckets = []
        for b in sources.status():
            rule = b.rule
            buckets.append(
                {
                    "url": rule.url,
                    "configId": rule.config_id,
                    "rate": rule.rate,
                    "periodSeconds": rule.period,
                    "perSecond": round(rule.per_second, 6),
                    "algorithm": str(rule.algorithm),
                    "perCaller": rule.per_caller,
                    # a channel cap ("*") and the channel it caps; a named caller's row
                    "channelType": rule.channel if rule.url == CHANNEL_URL else None,
                    "callerKey": rule.caller,
                    "shadow": rule.shadow,
                    "stored": None if b.stored is None else round(b.stored, 3),
                    "debtMs": round(b.debt_ms, 3),
                    "nextFreeMs": None if b.next_free_ms is None else round(b.next_free_ms, 3),
                    # what the live state comes to, as `status --status` words it
                    "condition": condition(b),
                    # a window: permits counted in its window now, ms until that is 0; a
                    # calendar quota: used in its period (as quota.used)
                    "used": None if b.used is None else round(b.used),
                    "resetMs": None if b.reset_ms is None else round(b.reset_ms, 3),
                    # after pushback, in the row's units (per periodSeconds); the hold left
                    "effectiveRate": None
                    if b.effective_rate is None
                    else round(b.effective_rate, 6),
                    "heldMs": round(b.held_ms, 3),
                    # slots: calls in flight fleet-wide, where the row has maxConcurrent
                    "inFlight": b.in_flight,
                    "maxConcurrent": rule.max_concurrent,
                    # leases: ms of the rate each process takes per round trip (0: none)
                    "leaseMs": rule.lease_ms,
                    # priority classes: the class of calls that name none (null: default)
                    # and the shares each class below critical leaves (null: none)
                    "priority": None if rule.priority is None else rule.priority.value,
                    "reserve": None if rule.reserve is None else str(rule.reserve),
                    "shared": b.shared,
                    "error": b.error,
                    # a shared calendar quota: its period, used / limit, renewal
                    "quota": quota_json(b),
                }
            )
        return {
            "at": time.time(),
            "switch": switch_now(),
            "buckets": buckets,
            "fleet": sources.fleet(),
        }

    async def get_status(request: Request) -> Response:
        return _json(await run_in_threadpool(status_now))

    async def get_fleet(request: Request) -> Response:
        return _json(await run_in_threadpool(sources.fleet))

    async def get_audit(request: Request) -> Response:
        limit_text = request.query_params.get("limit", "100")
        if not _digits(limit_text) or not 1 <= int(limit_text) <= MAX_AUDIT:
            raise ApiError(400, f"limit {limit_text!r}: must be 1 to {MAX_AUDIT}", "limit")
        wanted = request.query_params.get("configId")
        if wanted is not None and (not _digits(wanted) or len(wanted) > 10):
            raise ApiError(400, f"configId {wanted!r}: must be a whole number", "configId")
        entries = await run_in_threadpool(
            lambda: read_audit(
                sources.engine,
                limit=int(limit_text),
                config_id=None if wanted is None else int(wanted),
            )
        )
        return _json({"entries": entries})

    # --- the page -----------------------------------------------------------------------

    async def page(request: Request) -> Response:
        response: HTMLResponse = templates.TemplateResponse(
            request,
            "index.html",
            {
                "read_only": not token,
                "key_prefix": settings.key_prefix,
                "database": settings.masked()["database_url"],
                # a configuration centre's switch is changed there: no buttons, but where
                "switch_centre": centre.where_to_change() if centre.external else "",
            },
        )
        response.headers.update(SECURITY_HEADERS)
        return response

    routes = [
        Route("/", page),
        Route("/api/rules", api(get_rules), methods=["GET"]),
        Route("/api/rules", api(post_rule), methods=["POST"]),
        Route("/api/rules/{config_id}", api(patch_rule), methods=["PATCH"]),
        Route("/api/rules/{config_id}", api(delete_rule), methods=["DELETE"]),
        Route("/api/switch", api(get_switch), methods=["GET"]),
        Route("/api/switch", api(put_switch), methods=["PUT"]),
        Route("/api/status", api(get_status), methods=["GET"]),
        Route("/api/fleet", api(get_fleet), methods=["GET"]),
        Route("/api/audit", api(get_audit), methods=["GET"]),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    extra = console_host_names(settings.console_hosts)
    return _Guard(Starlette(routes=routes), lambda host: host_allowed(host, listen_host, extra))
