"""A rate limit request as the limiter reads it: each descriptor's interface, caller
and permits; bad input refused before anything reaches Redis.

Envoy sends a ``domain`` and a list of descriptors, each a list of (key, value)
entries and an optional ``hits_addend``. The mapping is three settings:

- the entry named ``rls_interface_entry`` (default ``interface``) is the interfaceUrl;
- the entry named ``rls_caller_entry`` (default ``caller``) is the caller key (per-caller
  rows, named callers);
- ``rls_domain_channel`` (default false): true makes the domain the channelType: an
  interface is limited for the request only when its rows sit under that channel's cap.

Other entries are ignored (Envoy's own actions add some, such as ``remote_address``,
which a config may name as the caller entry instead). A descriptor without an interface
entry limits nothing, and is answered OK, as is a descriptor whose interface has no row.

Permits: the descriptor's ``hits_addend`` when set, else the request's, else 1 (0 also
means 1, as Envoy says). More than 2**31-1 is refused: a row's rateLimit is an INT(11).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway_limiter.config.settings import Settings
from gateway_limiter.core.pipeline import MAX_PERMITS


class BadRequest(ValueError):
    """The request cannot be decided; the message names what is wrong (answered
    ``INVALID_ARGUMENT``, and nothing reaches Redis)."""


@dataclass(frozen=True, slots=True)
class Wanted:
    """One descriptor as the limiter reads it."""

    #: The interfaceUrl, or None: the descriptor names none (not limited)
    interface: str | None
    #: The caller key, or None
    caller: str | None
    permits: int


#: One descriptor as it arrives: its (key, value) entries and its own hits_addend (None:
#: not set).
Descriptor = tuple[Sequence[tuple[str, str]], int | None]


def permits_of(hits: int | None, where: str) -> int | None:
    """``hits`` as permits (0: None, the default), or BadRequest naming ``where``."""
    if hits is None or hits == 0:
        return None
    if hits < 0 or hits > MAX_PERMITS:
        raise BadRequest(f"{where} hits_addend {hits} is beyond {MAX_PERMITS} (2**31-1)")
    return hits


def read_request(
    settings: Settings, domain: str, descriptors: Sequence[Descriptor], hits_addend: int
) -> list[Wanted]:
    """Every descriptor of a request, read; BadRequest for an empty domain, an entry
    without a key or value, an entry given twice, or too many permits."""
    if not domain:
        raise BadRequest("domain is empty")
    default = permits_of(hits_addend, "the request's") or 1
    interface_entry, caller_entry = settings.rls_interface_entry, settings.rls_caller_entry
    wanted = []
    for number, (entries, hits) in enumerate(descriptors, start=1):
        found: dict[str, str] = {}
        for key, value in entries:
            if not key:
                raise BadRequest(f"descriptor {number}: an entry has no key")
            if not value:
                raise BadRequest(f"descriptor {number}: entry {key!r} has no value")
            if key in (interface_entry, caller_entry):
                if key in found:
                    raise BadRequest(f"descriptor {number}: entry {key!r} is given twice")
                found[key] = value
        permits = permits_of(hits, f"descriptor {number}:") or default
        wanted.append(Wanted(found.get(interface_entry), found.get(caller_entry), permits))
    return wanted
