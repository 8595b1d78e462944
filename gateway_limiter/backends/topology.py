"""Where the servers of ``redis+cluster://`` and ``redis+sentinel://`` are: their URLs.

    redis+cluster://[user:password@]host:port[,host:port...][/0]
    redis+sentinel://[user:password@]host:port[,host:port...]/service_name

A cluster URL names some of its nodes (any of them: the client asks one for the map of
slots and nodes, and finds the rest); a sentinel URL names the sentinels and the
service (``sentinel monitor <service_name> ...``) whose master takes the decisions.
``user:password`` is for the Redis servers (cluster nodes, the sentinel's master), not
for the sentinels themselves. A cluster has only database 0. No query string is read,
and TLS (``rediss://``) is for one server only: neither is silently ignored, a URL
that has one is refused, naming the part.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

from gateway_limiter.observe.redact import mask_url


@dataclass(frozen=True, slots=True)
class Endpoints:
    """The servers and credentials one ``redis+cluster``/``redis+sentinel`` URL names."""

    #: (host, port) of each node (cluster) or sentinel, in the URL's order
    nodes: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None
    #: the monitored service (sentinel); "" for a cluster
    service_name: str


def parse_endpoints(url: str) -> Endpoints:
    """Read a ``redis+cluster://`` or ``redis+sentinel://`` URL.

    Raises ValueError naming the URL (password masked) and what is wrong with it.
    """
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    sentinel = scheme == "redis+sentinel"

    def bad(why: str) -> ValueError:
        return _bad(url, why)

    if not sep or scheme not in ("redis+cluster", "redis+sentinel"):
        raise bad("expected redis+cluster:// or redis+sentinel://")
    if "?" in rest or "#" in rest:
        raise bad("options after '?' or '#' are not supported here")
    # The password may hold "/" or "@": the servers start after the last "@".
    userinfo, at, hosts_and_path = rest.rpartition("@")
    hosts, _, path = hosts_and_path.partition("/")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    nodes = tuple(_node(part, url) for part in hosts.split(","))
    path = path.strip("/")
    if sentinel:
        if not path or "/" in path:
            raise bad("name the monitored service: redis+sentinel://host:port/service_name")
        return Endpoints(nodes, username, password, unquote(path))
    if path not in ("", "0"):
        raise bad(f"a Redis Cluster has database 0 only, not {path!r}")
    return Endpoints(nodes, username, password, "")


def _bad(url: str, why: str) -> ValueError:
    return ValueError(f"redis_url {mask_url(url)}: {why}")


def _node(text: str, url: str) -> tuple[str, int]:
    host, colon, port = text.strip().rpartition(":")
    if not colon or not host:
        raise _bad(url, f"{text.strip()!r} is not host:port")
    host = host.strip("[]")  # [::1]:7000
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise _bad(url, f"port {port!r} of {host} is not a number from 1 to 65535")
    return host, int(port)
