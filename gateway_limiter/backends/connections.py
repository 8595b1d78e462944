"""The connection a decision runs on, and the pipelined round trips threads share.

Shared by the one-Redis backend (``backends/redis.py``, Sentinel's too), Redis Cluster
(``backends/cluster.py``) and, for the read deadline and the packer, asyncio:

- ``following``: a redis-py connection class whose read deadline follows the round
  trips seen (``backends/round_trips.py``), that writes with one system call, and that
  takes replies already in the socket with one (``take_ready``);
- ``write_pipelined`` / ``read_pipelined``: one batch of ``shared_trips``' calls written
  in one write, and its replies read, each call settled with its own (NOSCRIPT: load,
  and ask again for the calls it hit);
- ``connection_failed`` / ``call_error``: which errors fail a connection, and which are
  one call's own answer.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from typing import Any

import redis
from redis.exceptions import NoScriptError, ResponseError

from gateway_limiter.backends.base import BackendError
from gateway_limiter.backends.round_trips import RoundTrips
from gateway_limiter.backends.scripts import SCRIPTS, Packer, Reloads, describe
from gateway_limiter.backends.shared_trips import Queued, stamp
from gateway_limiter.config.settings import Settings

__all__ = [
    "call_error",
    "connection_failed",
    "following",
    "packer",
    "read_pipelined",
    "round_trips",
    "write_pipelined",
]


def round_trips(settings: Settings) -> RoundTrips:
    """The read deadline of one backend's connections (``backends/round_trips.py``)."""
    return RoundTrips(settings.redis_timeout, settings.redis_timeout_ceiling)


def following(connection_class: type[Any], trips: RoundTrips) -> type[Any]:
    """``connection_class`` (a redis-py connection: plain, TLS, Unix, Sentinel's) whose
    read deadline is ``trips.timeout_s``, and whose round trips ``trips`` sees.

    The socket's timeout is set only when the deadline has moved (rarely: it moves in
    steps); timing a round trip costs two reads of the monotonic clock, no system call.
    A refused or reset connection fails at once, as before.

    On a plain socket (not TLS) a write is one system call (``os.write`` on its
    non-blocking file, the rest, if any, by ``sendall``), and ``take_ready`` feeds the
    hiredis parser what the socket holds with one ``readv``: the socket's own calls make
    two each (a poll first), and with threads waiting for the GIL each call that lets go
    of it wakes one of them.
    """

    class Following(connection_class):  # type: ignore[misc]
        _sent_s = 0.0
        socket_timeout: float | None
        _sock: Any
        _parser: Any

        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            self._sent_s = time.monotonic()
            sock = self._sock
            if type(sock) is socket.socket and len(command) == 1 and not check_health:
                # One system call where the socket's sendall makes two (it polls
                # first): with threads waiting for the GIL, each call that lets go of
                # it wakes one of them for nothing. Its file is non-blocking (it has a
                # timeout); what the kernel does not take now goes by sendall.
                data = command[0]
                try:
                    sent = os.write(sock.fileno(), data)
                except BlockingIOError:
                    sent = 0
                except OSError as e:
                    self.disconnect()
                    raise redis.ConnectionError(f"Error while writing to socket: {e}") from e
                if sent == len(data):
                    return
                command = [memoryview(data)[sent:]]
            super().send_packed_command(command, check_health)

        def read_response(self, *args: Any, **kwargs: Any) -> Any:
            timeout_s = trips.timeout_s
            if timeout_s != self.socket_timeout:
                self._follow(timeout_s)
            reply = super().read_response(*args, **kwargs)
            trips.observe(time.monotonic() - self._sent_s)
            return reply

        def take_ready(self) -> None:
            """Feed the parser what the socket holds now, in one system call, without
            waiting: a batch's reader, woken after its replies came, would otherwise
            poll, then read (two calls that each let go of the GIL). Nothing when the
            parser keeps no such buffer (the pure-Python one), for TLS or a socket
            without a timeout (blocking), or when the socket holds nothing yet; an
            error is left to the read that follows."""
            sock, parser = self._sock, self._parser
            reader = getattr(parser, "_reader", None)
            buffer = getattr(parser, "_buffer", None)
            if type(sock) is not socket.socket or reader is None or type(buffer) is not bytearray:
                return
            if sock.gettimeout() is None:  # a blocking socket: readv would wait
                return
            if reader.has_data():
                return
            try:
                taken = os.readv(sock.fileno(), [buffer])
            except OSError:
                return
            if taken:
                reader.feed(buffer, 0, taken)

        def _follow(self, timeout_s: float) -> None:
            self.socket_timeout = timeout_s  # also the next connect's
            if self._sock is not None:
                self._sock.settimeout(timeout_s)
            # The pool checks a connection out with can_read(), which sets a timeout of
            # 0 and puts back the one its parser took at connect: give the parser this
            # one, or every check-out would put the old one back.
            parser = self._parser
            buffer = getattr(parser, "_buffer", None)
            if hasattr(buffer, "socket_timeout"):  # the pure-Python parsers
                buffer.socket_timeout = timeout_s  # type: ignore[union-attr]
            if hasattr(parser, "_socket_timeout"):  # hiredis
                parser._socket_timeout = timeout_s

    Following.__name__ = Following.__qualname__ = f"Following{connection_class.__name__}"
    return Following


def packer(connection_kwargs: dict[str, Any]) -> Packer:
    """The packer of a pool's commands, in the encoding its connections use."""
    return Packer(
        connection_kwargs.get("encoding", "utf-8"),
        connection_kwargs.get("encoding_errors", "strict"),
    )


def connection_failed(error: BaseException) -> bool:
    """True when ``error`` (a BackendError from ``backend_errors``) means the connection
    or Redis failed, False when it is one call's own error reply (a script error)."""
    cause = error.__cause__ if isinstance(error, BackendError) else error
    return not isinstance(cause, ResponseError)


def call_error(error: ResponseError) -> BackendError:
    """An error reply that is one call's own (its script failed for it), as the
    BackendError its caller gets: ``connection_failed`` reads its cause, so it fails no
    other call."""
    failure = BackendError(describe(error))
    failure.__cause__ = error
    return failure


def write_pipelined(
    conn: Any, pack: Packer, calls: list[Queued], load: tuple[str, ...] = ()
) -> None:
    """The calls' EVALSHAs in one write on ``conn`` (``shared_trips``), after a SCRIPT
    LOAD of each script of ``load`` (scripts known to be missing). Raises when the
    write fails; then ``conn`` must be dropped."""
    packed = [pack(("SCRIPT", "LOAD", SCRIPTS[n])) for n in load]
    packed += [pack(("EVALSHA", *w.call.evalsha)) for w in calls]
    stamp(calls)
    conn.send_packed_command([b"".join(packed)], check_health=False)


def read_pipelined(
    conn: Any,
    pack: Packer,
    calls: list[Queued],
    load: tuple[str, ...] = (),
    reply_error: Callable[[ResponseError], BaseException] = call_error,
) -> None:
    """The replies of what ``write_pipelined(conn, pack, calls, load)`` wrote, in order:
    each call settled with its own reply (``Queued.settle``; its caller is woken later,
    by ``shared_trips``). An error reply is that call's alone (``reply_error`` says
    what it gets), and a NOSCRIPT loads the script on ``conn``'s server and asks again,
    in one more write, for just the calls it hit. Raises when the round trip itself
    fails; then replies may be unread, and ``conn`` must be dropped."""
    take_ready = getattr(conn, "take_ready", None)  # a ``following`` connection's
    rounds = Reloads(calls, lambda w: w.call.name, load)
    for sent, names in rounds:
        if rounds.again:
            write_pipelined(conn, pack, sent, names)
        elif take_ready is not None:
            take_ready()
        for _ in names:
            conn.read_response()
        for waiting in sent:
            try:
                waiting.settle(conn.read_response())
            except NoScriptError:  # flushed or restarted: load, ask again
                rounds.missing(waiting)
            except ResponseError as e:  # this call's alone: its script failed, a redirect
                waiting.settle(error=reply_error(e))
    for waiting in rounds.lost:
        waiting.settle(error=BackendError(Reloads.error))
