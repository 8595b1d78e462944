"""While Redis is away, a heartbeat may still answer (Redis flapping, or reachable from
the heartbeat but not the decisions) and change this process's part of a rule. The
process must then decide at the new part with what it admitted at the old one counted
against it: never two buckets, one per part, each admitting in full.

The outage is decided by the failure policy on a clock the test drives."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Mapping

import pytest

from gateway_limiter.backends.base import Clocks
from gateway_limiter.backends.fleet import Heartbeat
from gateway_limiter.backends.memory import MemoryBackend
from gateway_limiter.config.rules import Rule, build_rules
from gateway_limiter.config.settings import Settings
from gateway_limiter.config.table import ConfRow
from gateway_limiter.core.failure import Policy
from gateway_limiter.core.fleet import Fleet
from gateway_limiter.model.bucket import Verdict

RATE = 10  # permits per second, and the bucket's capacity
URL = "/flapping"


def go_ahead_times(first_part: float | None, second_part: float) -> list[float]:
    """A call every millisecond for 1 s, each willing to wait 10 s; the claim goes
    from ``first_part`` (None: Redis has not answered yet, the fleet's size unknown) to
    ``second_part`` half-way. When each admitted call goes."""
    rule = Rule(url=URL, rate=RATE, cache=10.0, config_id=1)
    fleet = Fleet(Settings(redis_url="redis://unused"), shared=True)
    if first_part is not None:
        fleet.beat(Heartbeat(live=2, claims={URL: first_part}))
    now = [0.0]
    policy = Policy("share", MemoryBackend)
    policy.outage_began(start_empty=first_part is not None)
    policy.local = MemoryBackend(clocks=Clocks(lambda: now[0]))
    went = []
    for ms in range(1000):
        if ms == 500:  # a heartbeat answers while the breaker is still open
            fleet.beat(Heartbeat(live=2, claims={URL: second_part}))
        now[0] = ms * 1000.0
        verdict = policy.reserve(fleet.share(rule), 1, 10.0)
        if verdict.allowed:
            went.append((now[0] + verdict.wait_us) / 1e6)
    return sorted(went)


def most_over_a_span(went: list[float], part: float) -> float:
    """How far the admissions exceed C + R x T at ``part`` over their worst span (> 0:
    more than the part admits)."""
    rate, capacity = RATE * part, max(1, int(RATE * part))
    worst = 0.0
    for i, start in enumerate(went):
        for j in range(i, len(went)):
            worst = max(worst, (j - i + 1) - capacity - rate * (went[j] - start))
    return worst


def test_a_smaller_part_counts_what_the_larger_one_admitted() -> None:
    # At part 1 the bucket booked about 95 permits into the next 10 s; a fresh bucket
    # at 0.5 then booked about 40 more over the same seconds: 135 where 115 is the most.
    went = go_ahead_times(1.0, 0.5)
    assert len(went) >= 90  # the first part's bookings stand
    assert most_over_a_span(went, 1.0) <= 1e-6


def test_a_larger_part_counts_what_the_smaller_one_admitted() -> None:
    went = go_ahead_times(0.5, 1.0)
    assert len(went) >= 45
    assert most_over_a_span(went, 1.0) <= 1e-6


def test_a_first_heartbeat_mid_outage_counts_what_the_whole_rule_admitted() -> None:
    # Before Redis ever answered, the rule is decided whole (its bucket full); the
    # first heartbeat's part then opened a second bucket beside it.
    went = go_ahead_times(None, 0.5)
    assert len(went) >= 100
    assert most_over_a_span(went, 1.0) <= 1e-6


def _went_a_b_a(
    algorithm: str, rate: int, parts: list[float], caller: Callable[[int], str] | None = None
) -> tuple[Rule, list[float]]:
    """A shared limit of ``rate`` a second and a per-caller one beside it; two callers
    take turns, a call a millisecond for 3 s, each willing to wait 10 s; the claim
    goes through ``parts`` in equal spells (A -> B -> A ...); ``caller``: who calls at
    each millisecond instead. The shared limit, and when each admitted call goes."""
    rows = [
        ConfRow(1, None, None, URL, rate, 10.0, 1, algorithm=algorithm, period_seconds=1),
        ConfRow(2, None, None, URL, rate * 10, 10.0, 1, algorithm=algorithm, per_caller=1),
    ]
    rule = build_rules(rows, 0.5, "UTC").rules[URL]
    fleet = Fleet(Settings(redis_url="redis://unused"), shared=True)
    fleet.beat(Heartbeat(live=2, claims={URL: parts[0]}))
    now = [0.0]
    policy = Policy("share", MemoryBackend)
    policy.outage_began(start_empty=True)
    policy.local = MemoryBackend(clocks=Clocks(lambda: now[0]))
    went = []
    spell = 3000 // len(parts)
    for ms in range(3000):
        if ms and ms % spell == 0:  # a heartbeat answers while the breaker is still open
            fleet.beat(Heartbeat(live=2, claims={URL: parts[ms // spell]}))
        now[0] = ms * 1000.0
        key = ("k1" if ms % 2 else "k2") if caller is None else caller(ms)
        verdict = policy.reserve(fleet.share(rule), 1, 10.0, key, whole=rule)
        if verdict.allowed:
            went.append((now[0] + verdict.wait_us) / 1e6)
    (shared,) = [r for r in rule.limits if not r.per_caller]
    return shared, sorted(went)


def test_a_part_that_comes_back_counts_what_the_other_part_admitted() -> None:
    # A -> B -> A with a per-caller limit beside the shared one: back at A, the shared
    # limit's state went on from the state A had left, stale, not from what B admitted
    # (the second caller found it live and took it as carried): 11 beyond C + R x T on
    # a bucket of 10 a second, before the carry moved the state.
    shared, went = _went_a_b_a("token_bucket", 10, [1.0, 0.5, 1.0])
    worst = 0.0
    for i, start in enumerate(went):  # at the largest part, 1: C + R x T
        for j in range(i, len(went)):
            worst = max(worst, (j - i + 1) - shared.burst - shared.rate * (went[j] - start))
    assert worst <= 1e-6


def test_a_window_part_that_comes_back_counts_what_the_other_part_admitted() -> None:
    # 3 a second, the part 1 -> 0.3 -> 1 -> 0.3 -> 1: 4 in one second before the fix.
    _, went = _went_a_b_a("sliding_window", 3, [1.0, 0.3, 1.0, 0.3, 1.0])
    most = max(bisect.bisect_left(went, t + 1.0 - 1e-6) - i for i, t in enumerate(went))
    assert most <= 3


def test_a_caller_first_seen_after_the_part_changed_counts_what_the_others_admitted() -> None:
    # Caller k1 books the shared bucket (10 a second) well ahead at part 1; the part
    # goes to 0.5 and k2 asks for the first time in the outage: its shared limit must
    # go on from k1's, not start apart at the new part beside it (seed 3831, shrunk).
    shared, went = _went_a_b_a(
        "token_bucket", 10, [1.0, 0.5, 0.5], caller=lambda ms: "k1" if ms < 1000 else "k2"
    )
    worst = 0.0
    for i, start in enumerate(went):  # at the largest part, 1: C + R x T
        for j in range(i, len(went)):
            worst = max(worst, (j - i + 1) - shared.burst - shared.rate * (went[j] - start))
    assert worst <= 1e-6


def test_a_named_caller_first_seen_in_an_outage_keeps_the_channels_debt() -> None:
    # A channel of 5 a second over two interfaces: a caller of one books the channel 7
    # permits deep; then a caller with a row of its own on the other asks for the first
    # time in the outage, after an unnamed caller there. Its Rule has one limit more
    # (its row) than the interface's, and the carry from the interface's Rule paired
    # their limits by position: the channel's state went to the named row's key, and
    # the channel started afresh beside the debt (seed 2514, shrunk: three slots at
    # once on a channel booked until 0.9 s later).
    channel, other = "SUP", "/other"
    rows = [
        ConfRow(1, channel, None, URL, 1000, 10.0, 1, algorithm="token_bucket"),
        ConfRow(2, channel, None, URL, 1000, 10.0, 1, per_caller=1, caller_key="k1"),
        ConfRow(3, channel, None, other, 1000, 10.0, 1),
        ConfRow(4, channel, None, "*", 5, 10.0, 1),
    ]
    ruleset = build_rules(rows, 0.5, "UTC")
    rule, named = ruleset.rules[URL], ruleset.named[(URL, "k1")]
    fleet = Fleet(Settings(redis_url="redis://unused"), shared=True)
    fleet.beat(Heartbeat(live=1, claims={}))
    now = [0.0]
    policy = Policy("share", MemoryBackend)
    policy.outage_began(start_empty=True)
    policy.local = MemoryBackend(clocks=Clocks(lambda: now[0]))
    # the channel starts empty; one permit on the interface, then 7 on the other
    first = policy.reserve(fleet.share(rule), 1, None, "a", whole=rule)
    booked = policy.reserve(fleet.share(ruleset.rules[other]), 7, None, "b")
    assert first.allowed and booked.allowed
    assert booked.wait_us / 1e6 == pytest.approx(1.6)
    went = []
    for ms in range(10, 3000, 10):
        now[0] = ms * 1000.0
        if policy.reserve(fleet.share(named), 1, 0.0, "k1", whole=named).allowed:
            went.append(ms / 1000)
    # the channel is the named caller's too: nothing before the booked permits go,
    # then 5 a second
    assert went, "the named caller never got a permit"
    assert min(went) >= 1.6 - 1e-9
    assert len(went) <= 5 * (3.0 - 1.6) + 1


OTHER = "/other"


def on_one_channel(
    live: int,
    claims: dict[str, float],
    local: Callable[[list[float]], MemoryBackend] | None = None,
) -> tuple[Mapping[str, Rule], Fleet, Policy, list[float]]:
    """``URL`` and ``OTHER`` (1,000 a second each) under a channel cap of 2 a second, in
    an outage under ``share`` as a process sees it that heard of ``live`` members and
    ``claims``: the rules, the fleet, the policy (started empty; its in-process state
    ``local(now)``, else ``memory://``, on ``now``) and ``now`` (µs, set by the test)."""
    rows = [
        ConfRow(1, "SUP", None, URL, 1000, 10.0, 1),
        ConfRow(2, "SUP", None, OTHER, 1000, 10.0, 1),
        ConfRow(3, "SUP", None, "*", 2, 10.0, 1),
    ]
    rules = build_rules(rows, 0.5, "UTC").rules
    fleet = Fleet(Settings(redis_url="redis://unused"), shared=True)
    fleet.beat(Heartbeat(live=live, claims=claims))
    now = [0.0]
    policy = Policy("share", MemoryBackend)
    policy.outage_began(start_empty=True)
    policy.local = local(now) if local is not None else MemoryBackend(clocks=Clocks(lambda: now[0]))
    return rules, fleet, policy, now


def test_a_channels_part_changed_mid_outage_carries_over_to_its_other_interfaces() -> None:
    # A channel of 2 a second over two interfaces; the process thought itself alone
    # (N = 1) and one interface booked the channel 10 permits deep (to 5 s); a heartbeat
    # then says N = 2 and the other interface asks for the first time in the outage: the
    # channel's part is 0.5 now, and its state must carry on from part 1's. Before, the
    # carry followed the interface only: the channel started apart at 0.5 beside the
    # debt (seed 6274, shrunk: 5.3 permits beyond R x T + C).
    other = OTHER
    rules, fleet, policy, now = on_one_channel(live=1, claims={})
    booked = policy.reserve(fleet.share(rules[URL]), 10, None, "a", whole=rules[URL])
    assert booked.allowed
    assert booked.wait_us / 1e6 == pytest.approx(5.0)
    fleet.beat(Heartbeat(live=2, claims={}))  # a heartbeat answers while the breaker is open
    went = []
    for ms in range(10, 8000, 10):
        now[0] = ms * 1000.0
        if policy.reserve(fleet.share(rules[other]), 1, 0.0, "b", whole=rules[other]).allowed:
            went.append(ms / 1000)
    assert went, "the other interface never got a permit"
    assert min(went) >= 5.0 - 1e-9
    assert len(went) <= 1 * (8.0 - 5.0) + 1  # the channel at part 0.5: 1 a second


def _channel_went_back(claims: dict[str, float], live_after: int) -> list[float]:
    """A channel of 2 a second over two interfaces at N = 2; ``URL`` decides first (the
    channel started empty), then the other interface books it 3 permits deep after a
    heartbeat said N = ``live_after`` (at 1/2, 1 a second: to 4 s); the heartbeat then says
    N = 2 again and ``URL``, whose part is what it was, asks every 10 ms with no wait.
    When it goes."""
    other = OTHER
    rules, fleet, policy, now = on_one_channel(live=2, claims=claims)
    assert not policy.reserve(fleet.share(rules[URL]), 1, 0.0, "a", whole=rules[URL]).allowed
    fleet.beat(Heartbeat(live=live_after, claims=claims))
    booked = policy.reserve(fleet.share(rules[other]), 3, None, "b", whole=rules[other])
    assert booked.allowed
    fleet.beat(Heartbeat(live=2, claims=claims))
    went = []
    for ms in range(10, 8000, 10):
        now[0] = ms * 1000.0
        if policy.reserve(fleet.share(rules[URL]), 1, 0.0, "a", whole=rules[URL]).allowed:
            went.append(ms / 1000)
    return went


def test_a_channel_another_interface_booked_at_the_same_part_holds_for_a_claimed_one() -> None:
    # N = 2 throughout: the channel at 1/2 is 1 a second, written as 1,000,000 per
    # 1,000,000 s on the interface with a claim and as 2 per 2 s on the one without:
    # two keys. The other moved the channel's state to its key and booked it to 4 s;
    # the first, its part unchanged, decided on its own key, found it empty and took
    # a fresh full bucket at 0.01 s (seed 20703, shrunk).
    went = _channel_went_back({URL: 0.475}, 2)
    assert went, "the interface never got a permit"
    assert min(went) >= 4.0 - 1e-9
    assert len(went) <= 1 * (8.0 - 4.0) + 1


def test_a_channel_booked_at_another_n_holds_when_the_first_n_comes_back() -> None:
    # N = 2 -> 3 -> 2: the other interface moved the channel to 1/3 (2/3 a second)
    # and booked it to 6 s; back at 1/2, the first interface's part was what it had
    # been, and it found the channel's 1/2 key empty: a fresh full bucket.
    went = _channel_went_back({}, 3)
    assert went, "the interface never got a permit"
    assert min(went) >= 6.0 - 1e-9
    assert len(went) <= 1 * (8.0 - 6.0) + 1


class _Paused(MemoryBackend):
    """``memory://`` whose next ``reserve`` of ``held`` waits at ``inside`` until
    ``resume`` is set: a thread stopped between the policy's checks and its reserve."""

    def __init__(self, now: list[float], held: str) -> None:
        super().__init__(clocks=Clocks(lambda: now[0]))
        self.held, self.inside, self.resume = held, threading.Event(), threading.Event()

    def reserve(
        self,
        rule: Rule,
        permits: int,
        timeout: float | None,
        caller: str | None = None,
        *,
        now: float | None = None,
    ) -> Verdict:
        if rule.url == self.held and not self.inside.is_set():
            self.inside.set()
            assert self.resume.wait(10), "never resumed"
        return super().reserve(rule, permits, timeout, caller, now=now)


def test_threads_of_one_process_never_decide_a_channel_on_a_key_another_just_emptied() -> None:
    """Two threads of one process under ``share``: ``URL``'s thread has run the policy's
    checks (its channel's cap is where it last left it) and is about to reserve; the
    other interface's thread then decides and moves the channel's state to its own key.
    Were the two steps apart, ``URL``'s reserve would find its key emptied and take a
    fresh full bucket on a channel booked to 4 s. The other thread waits for the first
    to finish instead (it is given 0.5 s to overtake, which it must not)."""
    other = OTHER
    # a claim on URL, none on the other: two keys for the same 1/2 of the channel
    rules, fleet, policy, now = on_one_channel(
        live=2, claims={URL: 0.475}, local=lambda now: _Paused(now, held="")
    )
    local = policy.local
    assert isinstance(local, _Paused)
    mine, theirs = fleet.share(rules[URL]), fleet.share(rules[other])
    assert not policy.reserve(mine, 1, 0.0, "a", whole=rules[URL]).allowed  # started empty
    assert policy.reserve(theirs, 3, None, "b", whole=rules[other]).allowed  # booked to 4 s
    now[0] = 1_000_000.0  # 1 s: the channel is on the other's key, booked to 4 s
    assert not policy.reserve(mine, 1, 0.0, "a", whole=rules[URL]).allowed  # moved back
    now[0] = 2_000_000.0
    local.held = URL
    verdicts: dict[str, bool] = {}

    def decide(name: str, rule: Rule, whole: Rule) -> None:
        verdicts[name] = policy.reserve(rule, 1, 0.0, name, whole=whole).allowed

    first = threading.Thread(target=decide, args=("a", mine, rules[URL]))
    first.start()
    assert local.inside.wait(10)  # past the checks, about to reserve
    second = threading.Thread(target=decide, args=("b", theirs, rules[other]))
    second.start()
    second.join(0.5)  # real time: the other thread must not get through meanwhile
    overtook = not second.is_alive()
    local.resume.set()
    first.join(10)
    second.join(10)
    assert not overtook, "the other interface's decision ran between the checks and the reserve"
    assert verdicts == {"a": False, "b": False}  # the channel is booked to 4 s
