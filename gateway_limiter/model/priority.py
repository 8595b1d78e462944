"""Priority classes and trunk reservation: which calls a limit keeps capacity for.

A supplier's cap covers calls of very different worth: a booking earns money, a search
for a fare nobody books does not. Each call has a class (``Priority``), from the call's
``priority=`` argument or else its row's ``priority`` column (NULL: ``default``):

    critical > default > sheddable_plus > sheddable

A limit (a rate row or a channel row) may hold capacity back for the classes above a
class: its ``reserve`` column, written ``default=0.1,sheddable_plus=0.3,sheddable=0.5``,
gives each class below ``critical`` the share of the limit's capacity it must leave
(``Reserve``). This is telephony's trunk reservation: a call of class c is admitted
only if, after taking its permits, at least c's share is left, so under overload the
lower classes stop while the higher ones still find capacity. With no higher-class
demand a lower class still gets the whole rate: the reserve is a floor held back at
each moment, not a share taken away, and it never admits more than the limit does.

What "capacity" and "left" mean per kind of limit (``model/limits.py``): a token
bucket's capacity and its stored permits; a window's limit and what the window has not
counted; ``maxConcurrent`` and the slots not held. Only ``critical`` may wait by
reserving future permits (a bucket's debt, a later window); a lower class on a limit
with a reserve goes now or not at all, and its wait, if its budget allows, is spent
without reserving anything before it asks again (docs/priority.md).

A class missing from ``reserve`` takes the share of the class above it (``default``'s
is 0 when missing), so ``sheddable=0.5`` alone reserves half for every class above
``sheddable``. Shares are in [0, 1) and may not shrink toward lower classes.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Final, NamedTuple


class Priority(StrEnum):
    """A call's class, highest first. Each member equals its text (the ``priority``
    column, the metrics' ``priority`` label, ``Decision.priority``)."""

    CRITICAL = "critical"
    DEFAULT = "default"
    SHEDDABLE_PLUS = "sheddable_plus"
    SHEDDABLE = "sheddable"

    @property
    def rank(self) -> int:
        """0 for ``critical`` up to 3 for ``sheddable``: the index into ``Reserve``."""
        return _RANK[self]


_RANK: Final = {p: i for i, p in enumerate(Priority)}
#: Every class's text, highest first (messages list them so).
PRIORITIES: Final[tuple[str, ...]] = tuple(p.value for p in Priority)
#: The longest ``reserve`` text (the column is VARCHAR(128)).
MAX_RESERVE_LENGTH: Final = 128
#: The longest ``priority`` text (VARCHAR(16)).
MAX_PRIORITY_LENGTH: Final = 16


class Reserve(NamedTuple):
    """The share of a limit's capacity each class must leave after its call, by rank
    (``critical``'s always 0)."""

    critical: float
    default: float
    sheddable_plus: float
    sheddable: float

    def share(self, priority: Priority) -> float:
        """What a call of ``priority`` must leave, as a share of the capacity."""
        return self[priority.rank]

    def __str__(self) -> str:
        return ",".join(f"{p.value}={self[p.rank]:g}" for p in list(Priority)[1:])


#: No reserve: every class as ``critical``.
NO_RESERVE: Final = Reserve(0.0, 0.0, 0.0, 0.0)


class PriorityError(ValueError):
    """A ``priority`` or ``reserve`` value that cannot be; the message says why."""


def parse_priority(value: object) -> Priority:
    """``value`` as a Priority (PriorityError naming the classes when it is not one)."""
    if isinstance(value, Priority):
        return value
    if isinstance(value, str):
        try:
            return Priority(value.strip())
        except ValueError:
            pass
    raise PriorityError(f"priority {value!r} is not one of {', '.join(PRIORITIES)}")


def parse_reserve(text: object) -> Reserve | None:
    """The ``reserve`` column's text as a Reserve; None for NULL or an empty text.

    PriorityError when it is not ``class=share`` pairs separated by commas, names
    ``critical`` or another word, names a class twice, has a share outside [0, 1), or
    a share smaller than a higher class's.
    """
    if text is None:
        return None
    if not isinstance(text, str):
        raise PriorityError(f"reserve {text!r} is not text")
    if len(text) > MAX_RESERVE_LENGTH:
        raise PriorityError(f"reserve is longer than {MAX_RESERVE_LENGTH} characters")
    if text.strip() == "":
        return None
    given: dict[Priority, float] = {}
    for part in text.split(","):
        name, sep, number = part.partition("=")
        name, number = name.strip(), number.strip()
        if not sep or not name or not number:
            raise PriorityError(
                f"reserve {text!r}: {part.strip()!r} is not class=share (e.g. "
                "default=0.1,sheddable_plus=0.3,sheddable=0.5)"
            )
        if name == Priority.CRITICAL:
            raise PriorityError(
                f"reserve {text!r}: critical is the highest class and leaves nothing "
                "for any other (name default, sheddable_plus or sheddable)"
            )
        if name not in PRIORITIES:
            raise PriorityError(
                f"reserve {text!r}: {name!r} is not one of default, sheddable_plus, sheddable"
            )
        cls = Priority(name)
        if cls in given:
            raise PriorityError(f"reserve {text!r}: {name} is given twice")
        try:
            share = float(number)
        except ValueError:
            raise PriorityError(f"reserve {text!r}: {number!r} is not a number") from None
        if not (math.isfinite(share) and 0.0 <= share < 1.0):
            raise PriorityError(
                f"reserve {text!r}: the share of {name} must be at least 0 and below 1, "
                f"got {number}"
            )
        given[cls] = share
    shares, above = [0.0], Priority.CRITICAL  # above: the class the last share is from
    for cls in list(Priority)[1:]:
        share = given.get(cls, shares[-1])
        if share < shares[-1]:
            raise PriorityError(
                f"reserve {text!r}: {cls.value} must leave at least what {above.value} "
                f"leaves ({shares[-1]:g}), got {share:g}: a lower class never takes "
                "capacity a higher one leaves"
            )
        if cls in given:
            above = cls
        shares.append(share)
    return Reserve(*shares)
