"""The algorithms, each defined once: what the ``algorithm`` column may say, and for each
the kind of state it keeps, its code in the scripts, and whether it is a window.

Everything else reads this table: the rows (``config/rules.py``: ``Rule.kind``,
``Rule.most``), the model (``model/limits.py``: one ``LimitModel`` per kind), the keys and
script arguments (``backends/state.py``, ``backends/scripts.py``), the decision path and
the fleet share (``core/``), and live status. A calendar quota (``quotaPeriod``) is a
row here too, looked up by ``Quota.CALENDAR`` in place of its row's algorithm. A new
algorithm is a row here, its
``LimitModel`` (and ``limits.lua`` branch) when it keeps a new kind of state, and its
column checks in ``config/row_checks.py`` (``algorithm_problem``).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final, NamedTuple, TypeAlias


class Algorithm(StrEnum):
    """The ``algorithm`` column's values. Each member equals its column value (a str), so
    rows, logs, metrics labels and script arguments carry the same text as ever."""

    TOKEN_BUCKET = "token_bucket"
    WARM_UP = "warm_up"
    SLIDING_WINDOW = "sliding_window"
    FIXED_WINDOW = "fixed_window"


class LimitKind(StrEnum):
    """The kinds of state a limit keeps: the last part of its key, and what ``limits.lua``
    is told (the values are the scripts' and the keys', and must not change)."""

    TOKEN_BUCKET = "tb"
    SLIDING_WINDOW = "sw"
    FIXED_WINDOW = "fw"
    CALENDAR = "cq"


class Quota(StrEnum):
    """Limits a row makes by another column than ``algorithm``: a ``quotaPeriod`` makes
    the row a calendar quota (``model/calendar.py``), whatever its algorithm says."""

    CALENDAR = "calendar"


#: What a limit is looked up by in the table: its row's algorithm, or its quota.
Kind: TypeAlias = Algorithm | Quota


class Spec(NamedTuple):
    """What one algorithm is, everywhere it matters."""

    #: the state it keeps (its key's last part; ``model/limits.py``'s ``LimitModel``)
    kind: LimitKind
    #: its kind as ``limits.lua`` is told it (ARGV[5]); must not change
    code: float
    #: True: it counts calls in windows of its period (holds ``rate``); False: a bucket
    #: that holds its capacity (``maxPermits``, else the rate) and refills
    window: bool


#: Every algorithm, defined once.
ALGORITHM_TABLE: Final[dict[Kind, Spec]] = {
    Algorithm.TOKEN_BUCKET: Spec(LimitKind.TOKEN_BUCKET, 1.0, False),
    # a bucket whose stored permits cost: the same state and script code as a bucket
    Algorithm.WARM_UP: Spec(LimitKind.TOKEN_BUCKET, 1.0, False),
    Algorithm.SLIDING_WINDOW: Spec(LimitKind.SLIDING_WINDOW, 2.0, True),
    Algorithm.FIXED_WINDOW: Spec(LimitKind.FIXED_WINDOW, 3.0, True),
    # a fixed window whose windows are the periods of a calendar: its own state (the
    # period's start and its count) and code, the boundaries sent with each call
    Quota.CALENDAR: Spec(LimitKind.CALENDAR, 4.0, True),
}

#: A paced calendar quota's code in ``limits.lua``: the same state and key as the quota's
#: (pacing on or off keeps the period's count), its burst sent after every limit.
PACED_CALENDAR_CODE: Final = 5.0

#: Each kind of state's code in the scripts (from the table).
KIND_CODES: Final[dict[LimitKind, float]] = {
    spec.kind: spec.code for spec in ALGORITHM_TABLE.values()
}

#: The kinds of state that count calls in windows (from the table): a call of more
#: permits than such a limit's ``rate`` can never go.
WINDOW_KINDS: Final[frozenset[LimitKind]] = frozenset(
    spec.kind for spec in ALGORITHM_TABLE.values() if spec.window
)

#: The algorithms whose limit is a window (from the table): a count in its window, in
#: whole permits, not stored permits.
WINDOW_ALGORITHMS: Final[frozenset[Algorithm]] = frozenset(
    a for a in Algorithm if ALGORITHM_TABLE[a].window
)

#: Every algorithm's column value, in the order the CLI and messages list them (plain
#: strings: argparse and messages show them with repr).
ALGORITHMS: Final[tuple[str, ...]] = tuple(a.value for a in Algorithm)


def most_held(kind: Kind, rate: int, burst: int) -> int:
    """The most permits one limit ever lets go at once: a bucket's capacity (``burst``),
    a window's (or a calendar quota's) ``rate``."""
    return rate if ALGORITHM_TABLE[kind].window else burst
