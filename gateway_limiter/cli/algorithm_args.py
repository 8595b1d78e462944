"""The algorithm columns ``conf set`` is given, checked as the reload would check the row
they make, with errors naming the flag to change; the warning for a warm-up row whose
wait budget can never pay for its first cold permit; and the one for a rate lease too
short to hold more than one permit."""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING, Any

from gateway_limiter.cli.arguments import NONE_WORD
from gateway_limiter.cli.describe import fmt_field
from gateway_limiter.config.edits import algorithm_culprit
from gateway_limiter.config.rules import ALGORITHMS, MAX_LEASE_MS, Algorithm, algorithm_problem
from gateway_limiter.model.bucket import US_PER_S, shape

if TYPE_CHECKING:
    from gateway_limiter.config.table import ConfRow


#: The algorithm columns: model attribute -> (column, the ``conf set`` flag that sets it).
_ALGORITHM_FIELDS = {
    "algorithm": ("algorithm", "--algorithm"),
    "max_permits": ("maxPermits", "--max-permits"),
    "warmup_period": ("warmupPeriod", "--warmup"),
}


def given_algorithm_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The algorithm columns given on the command line (their defaults are SUPPRESS, so
    a flag left out is absent, and ``none`` is a given NULL)."""
    return {name: getattr(args, name) for name in _ALGORITHM_FIELDS if hasattr(args, name)}


def algorithm_args_problem(
    given: dict[str, Any], old: ConfRow | None, period: int = 1, per_caller: bool = False
) -> str:
    """Why the row would have invalid algorithm columns after ``conf set``, as an error
    naming the argument to change ("" when the row will be valid).

    The row after the change is the old row (or a new one) with only the given columns
    replaced, judged by ``rules.algorithm_problem``: the very check the reload makes.
    A value left over from the old row is never cleared silently; the message says
    which flag clears or sets it. ``period`` and ``per_caller`` pick the row, so they
    are the row's: a problem with them (warm_up is per second and shared) names the
    ``--period`` or ``--per-caller`` that picked it.
    """
    after = {
        name: given[name] if name in given else getattr(old, name, None)
        for name in _ALGORITHM_FIELDS
    }
    algorithm = after["algorithm"] or Algorithm.TOKEN_BUCKET
    max_permits, warmup = after["max_permits"], after["warmup_period"]
    problem = algorithm_problem(algorithm, max_permits, warmup, period, per_caller)
    if not problem:
        return ""
    if not algorithm_problem(algorithm, max_permits, warmup):
        flag = "--period" if period != 1 else "--per-caller"
        return f"argument {flag}: {problem}"
    # The same column the console names for these values (config.edits).
    culprit = algorithm_culprit(algorithm, max_permits, warmup)
    column, flag = _ALGORITHM_FIELDS[culprit]
    if culprit in given:
        # The flag given is wrong, or right only with another algorithm than the row's.
        wants = {"max_permits": Algorithm.TOKEN_BUCKET, "warmup_period": Algorithm.WARM_UP}.get(
            culprit
        )
        hint = ""
        if given[culprit] is not None and wants and wants != algorithm:
            hint = f"; the row's algorithm is {algorithm}: add --algorithm {wants}"
        return f"argument {flag}: {problem}{hint}"
    left = after[culprit]
    if culprit == "algorithm":  # an unknown name written by SQL
        fix = f"the row has algorithm {left!r}: add --algorithm {{{','.join(ALGORITHMS)}}}"
    elif left is None:  # warm_up without a warmupPeriod
        fix = f"add {flag} S (seconds, from 0.001 to 3600)"
    else:
        value = fmt_field(culprit, left)
        fix = f"the row has {column} {value}: add '{flag} {NONE_WORD}' to clear it"
    blamed = "--algorithm" if "algorithm" in given else flag
    return f"argument {blamed}: {problem}; {fix}"


def warm_up_cache_warning(rate: int, cache: float, warmup: float) -> str:
    """A warning when a warm-up row's wait budget is below the price of its first cold
    permit: every call on a cold interface would be refused, so it never warms up."""
    if rate <= 0:
        return ""
    sh = shape(rate, rate, warmup * US_PER_S)
    first = sh.stored_cost_us(sh.capacity, 1.0) / US_PER_S
    if cache >= first:
        return ""
    need = math.ceil(first * 100) / 100
    return (
        f"warning: on a cold warm_up interface the first call waits {first * 1000:.0f} ms "
        f"(about 3 / rate), more than cache {cache:g} s: callers that wait only the row's "
        f"cache are all refused and it never warms up; give --cache {need:g} or more"
    )


def one_permit_lease_warning(rate: int, period: int, lease_ms: int) -> str:
    """A warning when a row's rate lease holds one permit: n = max(1, floor(R x L / 1000))
    is 1 (``core/leases.lease_size``), so every permit still costs its round trip and the
    lease saves nothing; the least ``leaseMs`` for 2 permits a lease, if there is one."""
    per_second = rate / period
    if rate <= 0 or lease_ms <= 0 or per_second * lease_ms / 1000.0 + 1e-9 >= 2:
        return ""
    where = f"rate {rate}/s" if period == 1 else f"rate {rate} per {period} s ({per_second:.3g}/s)"
    said = (
        f"leaseMs {lease_ms} at {where} leases 1 permit at a time (n = max(1, floor(R x "
        f"leaseMs / 1000)) = 1): every call still costs a round trip, so the lease saves none"
    )
    need = math.ceil(2000 / per_second - 1e-9)
    if need > MAX_LEASE_MS:
        return (
            f"{said}; no leaseMs up to {MAX_LEASE_MS} makes 2 permits: clear it with --lease-ms 0"
        )
    return f"{said}; give --lease-ms {need} or more for 2 permits a lease, or --lease-ms 0"
