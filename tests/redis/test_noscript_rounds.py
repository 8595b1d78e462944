"""The NOSCRIPT rounds of a batch (``scripts.Reloads``) are one implementation that the
threads' shared round trips and the asyncio lanes both follow: the calls Redis answered
NOSCRIPT go again after a SCRIPT LOAD of just their scripts, up to RELOADS more rounds."""

from __future__ import annotations

from gateway_limiter.backends.scripts import RELOADS, Reloads


def test_only_the_calls_that_got_noscript_go_again_after_loading_their_scripts() -> None:
    calls = [("a", "bucket"), ("b", "limits"), ("c", "bucket")]
    rounds = Reloads(calls, lambda c: c[1], load=("slot",))
    seen = []
    for sent, load in rounds:
        seen.append((list(sent), load, rounds.again))
        if len(seen) == 1:
            rounds.missing(calls[1])
            rounds.missing(calls[2])
    assert seen == [
        (calls, ("slot",), False),
        ([calls[1], calls[2]], ("bucket", "limits"), True),
    ]
    assert rounds.lost == []


def test_a_script_lost_in_every_round_fails_its_calls_after_the_last() -> None:
    rounds = Reloads(["x", "y"], lambda c: "bucket")
    count = 0
    for sent, _ in rounds:
        count += 1
        rounds.missing(sent[-1])
    assert count == RELOADS + 1
    assert rounds.lost == ["y"]
    assert "NOSCRIPT" in Reloads.error
