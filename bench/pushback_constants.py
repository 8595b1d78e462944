#!/usr/bin/env python
"""Choosing pushback's constants: the model against a supplier that takes less than the row.

A driven-clock simulation on the reference model (``model/bucket.py`` with
``model/pushback.py``), no servers: a row of 60/s, callers offering 200 calls/s with no
wait budget, and a supplier that takes 30/s (a token bucket of capacity 5) and answers
429 above it; every 429 is a pushback without retry_after, so one burst of them counts
once per window. For each (decrease, recovery per second), over 16 s, from 5 s on: the
share of the calls reaching the supplier that succeed, and successes per second / 30.

    .venv/bin/python bench/pushback_constants.py
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

# Run as a script from anywhere: the checkout's package wins over any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness.args import description
from gateway_limiter.model import pushback
from gateway_limiter.model.bucket import BucketState, reserve
from gateway_limiter.model.pushback import PushbackState, factor_at, push, until_of

ROW, SUPPLIER, OFFERED, SECONDS, FROM_S = 60.0, 30.0, 200.0, 16.0, 5.0


def run(decrease: float, recovery_per_s: float) -> tuple[float, float]:
    pushback.DECREASE = decrease
    pushback.RECOVERY_PER_US = recovery_per_s / 1_000_000.0
    ours: BucketState | None = None
    theirs: BucketState | None = None
    pushed: PushbackState | None = None
    sent = ok = 0
    step_us = 1_000_000.0 / OFFERED
    now = 1_000_000_000.0
    for i in range(int(SECONDS * OFFERED)):
        now += step_us
        factor = factor_at(pushed, ROW, now)
        verdict, new = reserve(ours, ROW, ROW, 1, 0.0, now, 0.0, factor, until_of(pushed))
        ours = new or ours
        if not verdict.allowed:
            continue
        answer, got = reserve(theirs, SUPPLIER, 5.0, 1, 0.0, now)
        theirs = got or theirs
        counted = i >= FROM_S * OFFERED
        sent += counted
        if answer.allowed:
            ok += counted
        else:
            pushed, _, _ = push(pushed, ROW, None, now)
    return ok / max(sent, 1), ok / (SECONDS - FROM_S) / SUPPLIER


def main(argv: Sequence[str] | None = None) -> None:
    """Print the table (no options: ``--help`` says what it is)."""
    argparse.ArgumentParser(description=description(__doc__)).parse_args(argv)
    print("decrease  recovery/s  success share  successes / supplier rate")
    for decrease in (0.5, 0.7):
        for recovery in (0.02, 0.05, 0.1, 0.2):
            share, used = run(decrease, recovery)
            print(f"{decrease:8}  {recovery:10}  {share:13.3f}  {used:25.3f}")


if __name__ == "__main__":
    main()
