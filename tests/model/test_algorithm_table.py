"""Each algorithm is defined once, in ``model/algorithms.py``; the rows, the model, the
keys, the scripts' arguments and the decision path all read that one table."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from gateway_limiter.backends.state import limit, state_key
from gateway_limiter.config.rules import ALGORITHMS, Algorithm, Rule
from gateway_limiter.model.algorithms import (
    ALGORITHM_TABLE,
    KIND_CODES,
    WINDOW_ALGORITHMS,
    WINDOW_KINDS,
    LimitKind,
    Quota,
)
from gateway_limiter.model.calendar import Calendar
from gateway_limiter.model.limits import LIMIT_MODELS


def test_every_algorithm_has_one_row_and_every_kind_a_model_and_a_code() -> None:
    assert set(ALGORITHM_TABLE) == set(Algorithm) | set(Quota)
    assert ALGORITHMS == ("token_bucket", "warm_up", "sliding_window", "fixed_window")
    kinds = {spec.kind for spec in ALGORITHM_TABLE.values()}
    assert kinds == set(LimitKind) == set(LIMIT_MODELS) == set(KIND_CODES)
    # one code per kind, the ones limits.lua is documented to take
    assert sorted(KIND_CODES.values()) == [1.0, 2.0, 3.0, 4.0]
    lua = resources.files("gateway_limiter.backends").joinpath("limits.lua").read_text()
    told = {
        "tb": "a token bucket",
        "sw": "a sliding window",
        "fw": "a fixed window",
        "cq": "a calendar quota",
    }
    for kind, code in KIND_CODES.items():
        assert re.search(rf"kind {int(code)}, {told[kind]}:", lua), kind


def test_which_limits_are_windows_is_read_from_the_table() -> None:
    # the pushback's whole permits, status's "used" column and the model's refusal of a
    # call larger than a window all ask these two sets, made from the table's ``window``
    assert {"sliding_window", "fixed_window"} == WINDOW_ALGORITHMS
    assert {LimitKind.SLIDING_WINDOW, LimitKind.FIXED_WINDOW, LimitKind.CALENDAR} == WINDOW_KINDS
    rule = Rule("/w", 9, 0.0, 1, algorithm=Algorithm.TOKEN_BUCKET)
    assert rule.window_most == 0  # no window: no cap on one call's permits
    windows = (Rule("/w", 5, 0.0, 2, algorithm="fixed_window", period=60),)
    assert Rule("/w", 9, 0.0, 1, also=windows).window_most == 5


@pytest.mark.parametrize(
    ("algorithm", "key_end", "most"),
    [
        (Algorithm.TOKEN_BUCKET, ":tb", 7),  # a bucket holds its capacity
        (Algorithm.WARM_UP, ":tb", 5),  # warm-up keeps a bucket: capacity is the rate
        (Algorithm.SLIDING_WINDOW, ":sw", 5),  # a window holds its rate
        (Algorithm.FIXED_WINDOW, ":fw", 5),
    ],
)
def test_a_rule_reads_its_kind_key_and_size_from_the_table(
    algorithm: Algorithm, key_end: str, most: int
) -> None:
    capacity = 7 if algorithm is Algorithm.TOKEN_BUCKET else 0
    warmup = 2.0 if algorithm is Algorithm.WARM_UP else 0.0
    rule = Rule("/a", 5, 0.0, 1, capacity=capacity, algorithm=algorithm, warmup=warmup)
    spec = ALGORITHM_TABLE[algorithm]
    assert rule.kind is spec.kind
    assert state_key("p", rule) == "p:{/a}" + key_end
    assert rule.most == most
    assert limit(rule).kind is spec.kind
    assert spec.window == (algorithm in (Algorithm.SLIDING_WINDOW, Algorithm.FIXED_WINDOW))


def test_a_calendar_quota_is_the_tables_row_whatever_its_algorithm() -> None:
    calendar = Calendar.of("day", "Asia/Shanghai")
    for algorithm in Algorithm:
        rule = Rule("/q", 5, 0.0, 86_400, capacity=9, algorithm=algorithm, calendar=calendar)
        assert rule.spec is ALGORITHM_TABLE[Quota.CALENDAR]
        assert rule.kind is LimitKind.CALENDAR
        assert rule.most == 5  # a quota holds its rate, never a bucket's capacity
        assert state_key("p", rule) == "p:{/q}:cq:day"
        own = limit(rule, 1_700_000_000.0)
        assert own.kind is LimitKind.CALENDAR and own.bounds[1] <= 1_700_000_000e6 < own.bounds[2]
        assert KIND_CODES[own.kind] == 4.0
