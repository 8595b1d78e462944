#!/usr/bin/env python
"""Redis server time per decision: each shipped script against the least a script of
its contract must do, on a private ``redis-server``.

Run from the checkout, with the venv's Python (about 5 s)::

    python bench/server_time.py
    python bench/server_time.py --calls 5000 --repeats 9
    python bench/server_time.py --instructions    # and instructions (valgrind), ~20 s

Redis runs scripts on one thread, so the server time of one decision is what caps one
Redis master: at 30 µs a decision, one core holds about 33,000 decisions/s. This
measures that time with ``INFO commandstats`` (``cmdstat_evalsha``'s ``usec_per_call``,
the time Redis spent inside the command, not the round trip), after ``CONFIG
RESETSTAT``, for:

1. ``bucket.lua`` (an interface that is one token bucket; and warm-up; and a bucket
   with a ``reserve``, called by a ``sheddable`` call, against the same bucket
   without one: the cost of priority classes),
   ``pushback.lua`` and the fleet's heartbeat (``backends/fleet.py``, sent as EVAL:
   measured here as EVALSHA, so without hashing its body), against ``return 1`` and
   against the reference script of
   ``decision_cost.py``: ``TIME`` + ``GET`` + ``SET ... PX`` and no logic, the least
   any shared bucket does per decision;
2. ``limits.lua`` (windows, several limits), each case against its own minimal
   commands: the Redis commands that case cannot do without (the clock, the pushback
   key read, each limit's state read and written), with no logic.

Beside it, the Redis process's own CPU per call (``INFO cpu``, user + system): on a
loaded machine ``usec_per_call`` counts the time a script was preempted, the CPU does
not, and the CPU also counts reading the commands and writing the replies.

With ``--instructions`` (needs ``valgrind``), a third table counts the machine
instructions Redis runs inside each ``EVALSHA``, on a second private ``redis-server`` run
under callgrind (``--toggle-collect=evalShaCommand``). A count is the same on a quiet
host and a busy one, so its ratios are the steady check of the time ratios, which a
shared machine blurs by 10-20 % from one run to the next. An instruction is not a
nanosecond (a memory access costs more than an add), so the count is a cross-check, not
the target.

Each script is called with the arguments the limiter sends (built by
``backends/scripts.py`` for a limit so large that every call is admitted), sent in
pipelines of 100 so that the run is short; pipelining does not change what one call
costs inside Redis. Each cell is measured ``--repeats`` times, interleaved with the
others, and the median and the lowest are printed: on a loaded machine, a script
preempted while it runs is charged the time it did not run, so the lowest is the
cleaner figure and the median the more honest.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

# Run as a script from anywhere: the checkout's package wins over any installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness.args import description, int_at_least, positive_int, reachable_redis
from bench.harness.limiters import STATE_COMMANDS_LUA
from bench.harness.report import load_average, machine_facts, table
from bench.harness.runs import delete_keys, raise_interrupt
from bench.harness.servers import private_redis
from gateway_limiter.backends.fleet import HEARTBEAT_LUA, encode_tallies, heartbeat_args
from gateway_limiter.backends.scripts import SCRIPTS, Commands, ScriptCall, parse_reply
from gateway_limiter.config.rules import Algorithm, Rule, with_classes
from gateway_limiter.model.priority import Priority, parse_reserve

#: A limit so large that every call is admitted (the common case, and the dearest).
HUGE = 10_000_000
#: Members of the fleet whose heartbeat is measured (each process beats once a second).
FLEET = 1000
#: Calls per pipeline.
PIPELINE = 100

#: The least a decision on one fixed window, or on one token bucket under limits.lua,
#: does: the clock, the pushback key (the last key), the state read and written.
MINIMAL_GET_SET = """
local t = redis.call("TIME")
local p = redis.call("GET", KEYS[#KEYS])
local s = redis.call("GET", KEYS[1])
redis.call("SET", KEYS[1], "0123456789012345678901234567890123456789", "PX", 2000)
return {1, "0", "0", "0", "1"}
"""

#: The same for a sliding window (a list of call times): read its length, append,
#: trim to the rate (the cases' rate, HUGE), renew the expiry.
MINIMAL_LIST = f"""
local t = redis.call("TIME")
local p = redis.call("GET", KEYS[#KEYS])
local n = redis.call("LLEN", KEYS[1])
redis.call("RPUSH", KEYS[1], "1700000000000000")
redis.call("LTRIM", KEYS[1], {-HUGE}, -1)
redis.call("PEXPIRE", KEYS[1], 2000)
return {{1, "0", "0", "0", "1"}}
"""

#: The same for two limits of the token-bucket or fixed-window shape.
MINIMAL_TWO = """
local t = redis.call("TIME")
local p = redis.call("GET", KEYS[#KEYS])
local a = redis.call("GET", KEYS[1])
local b = redis.call("GET", KEYS[2])
redis.call("SET", KEYS[1], "0123456789012345678901234567890123456789", "PX", 2000)
redis.call("SET", KEYS[2], "0123456789012345", "PX", 2000)
return {1, "0", "0", "0", "1"}
"""


@dataclass(frozen=True)
class Case:
    """One script and the arguments it is called with, and the row it is compared to."""

    name: str
    source: str
    numkeys: int
    keys_and_args: tuple[Any, ...]
    against: str | None  # the name of the row it is divided by


def _call(
    commands: Commands, rule: Rule, pushback: bool = False, timeout: float | None = 0.0
) -> ScriptCall:
    if pushback:
        return commands.pushback(rule, None, None, None)
    return commands(rule, 1, timeout, None, None)


def _case(name: str, call: ScriptCall, against: str | None, source: str | None = None) -> Case:
    numkeys, *rest = call.args
    return Case(name, source or SCRIPTS[call.name], int(numkeys), tuple(rest), against)


REF = "ref: TIME+GET+SET PX"
#: A reserve as bench/priority.py's channel row has it.
RESERVE = "default=0.1,sheddable_plus=0.3,sheddable=0.5"
RESERVED = "bucket.lua, token bucket with a reserve (sheddable)"
#: The decision scripts: each call must be admitted (its reply allowed).
DECISIONS = (SCRIPTS["bucket"], SCRIPTS["limits"])


def _heartbeat_case(prefix: str) -> Case:
    """One process's beat as the limiter sends it: its demand and live numbers for one
    interface ride along, as they do for a process limiting one busy interface."""
    demand = json.dumps({"/server/bucket": 100.0})
    tallies = encode_tallies({"/server/bucket": (100.0, 0.0, 0.0)}, {})
    member = '{"host": "bench", "pid": 1}'
    _, numkeys, *rest = heartbeat_args(prefix, member, 3000, demand, tallies)
    return Case(f"fleet heartbeat, {FLEET:,} members", HEARTBEAT_LUA, numkeys, tuple(rest), REF)


TWO = "limits.lua, token bucket + 60 s window"


def cases(prefix: str) -> tuple[list[Case], list[Case]]:
    """Table 1 (bucket.lua, pushback.lua) and table 2 (limits.lua), in order."""
    commands = Commands(prefix)
    bucket = Rule("/server/bucket", HUGE, 0.0, 1)
    warm = Rule("/server/warm", HUGE, 0.0, 2, algorithm=Algorithm.WARM_UP, warmup=10.0)
    bucket_call = _call(commands, bucket)
    # the same bucket with a reserve, as a sheddable call is decided (its class's share)
    reserved = with_classes(
        Rule("/server/reserved", HUGE, 0.0, 7, reserve=parse_reserve(RESERVE))
    ).for_class(Priority.SHEDDABLE)
    one = [
        _case("floor: return 1", bucket_call, None, "return 1"),
        _case(REF, bucket_call, None, STATE_COMMANDS_LUA),
        _case("bucket.lua, token bucket", bucket_call, REF),
        # a caller that may wait (the row's cache): its budget is parsed, not recognised
        _case("bucket.lua, 0.2 s budget", _call(commands, bucket, timeout=0.2), REF),
        # cold, a warm-up bucket admits with a wait: any wait is taken (timeout None)
        _case("bucket.lua, warm-up (any wait)", _call(commands, warm, timeout=None), REF),
        _case(RESERVED, _call(commands, reserved), "bucket.lua, token bucket"),
        _case("pushback.lua (decrease)", _call(commands, bucket, pushback=True), REF),
        # one process's beat, in a fleet of FLEET members (set up by fill_fleet)
        _heartbeat_case(prefix),
    ]
    fixed = Rule("/server/fw", HUGE, 0.0, 3, algorithm=Algorithm.FIXED_WINDOW)
    sliding = Rule("/server/sw", HUGE, 0.0, 4, algorithm=Algorithm.SLIDING_WINDOW)
    two = Rule(
        "/server/two",
        HUGE,
        0.0,
        5,
        also=(Rule("/server/two", HUGE, 0.0, 6, algorithm=Algorithm.FIXED_WINDOW, period=60),),
    )
    fixed_call, sliding_call, two_call = (_call(commands, r) for r in (fixed, sliding, two))
    # the pair with a reserve on the 60 s window (a channel cap's, say), a sheddable call
    two_reserved = with_classes(
        Rule(
            "/server/two-reserved",
            HUGE,
            0.0,
            8,
            also=(
                Rule(
                    "/server/two-reserved",
                    HUGE,
                    0.0,
                    9,
                    algorithm=Algorithm.FIXED_WINDOW,
                    period=60,
                    reserve=parse_reserve(RESERVE),
                ),
            ),
        )
    ).for_class(Priority.SHEDDABLE)
    minimal_fw, minimal_sw, minimal_two = (
        "minimal: fixed window",
        "minimal: sliding window",
        "minimal: two limits",
    )
    several = [
        _case(minimal_fw, fixed_call, None, MINIMAL_GET_SET),
        _case("limits.lua, fixed window", fixed_call, minimal_fw),
        _case(minimal_sw, sliding_call, None, MINIMAL_LIST),
        _case("limits.lua, sliding window", sliding_call, minimal_sw),
        _case(minimal_two, two_call, None, MINIMAL_TWO),
        _case(TWO, two_call, minimal_two),
        _case(f"{TWO}, reserve (sheddable)", _call(commands, two_reserved), TWO),
    ]
    return one, several


def measure(
    client: redis.Redis, all_cases: list[Case], calls: int, repeats: int
) -> dict[str, list[float]]:
    """µs per call inside Redis (``usec_per_call``) of each case, ``repeats`` times each,
    interleaved."""
    shas = {c.name: client.script_load(c.source) for c in all_cases}
    for case in all_cases:
        if case.source == HEARTBEAT_LUA:  # the other members, alive for an hour
            key = case.keys_and_args[0]
            client.zadd(key, {f"member-{i}": 1e15 for i in range(FLEET - 1)})
    found: dict[str, list[float]] = {c.name: [] for c in all_cases}
    found |= {PROCESS + c.name: [] for c in all_cases}
    for case in all_cases:  # warm: state written, a sliding window's list full
        _run(client, shas[case.name], case, max(calls, 1500))
    for _ in range(repeats):
        for case in all_cases:
            client.config_resetstat()
            before = _cpu_s(client)
            _run(client, shas[case.name], case, calls)
            process = _cpu_s(client) - before
            stats = client.info("commandstats")["cmdstat_evalsha"]
            if int(stats["calls"]) != calls or int(stats.get("failed_calls", 0)):
                raise SystemExit(f"{case.name}: {stats}")
            found[case.name].append(float(stats["usec"]) / calls)
            found[PROCESS + case.name].append(process * 1e6 / calls)
    return found


def count_instructions(all_cases: list[Case], calls: int) -> dict[str, float]:
    """Instructions per call inside ``EVALSHA`` of each case, counted by callgrind on a
    private ``redis-server`` run under valgrind (deterministic: one run per case)."""
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            raise SystemExit(f"--instructions needs {tool} on PATH (Debian: apt install valgrind)")
    outdir = Path(tempfile.mkdtemp(prefix="gwl-bench-callgrind-"))
    wrapper = [
        "valgrind",
        "--tool=callgrind",
        "--collect-atstart=no",
        "--toggle-collect=evalShaCommand",  # count inside EVALSHA only
        f"--callgrind-out-file={outdir}/callgrind.out.%p",
    ]
    found: dict[str, float] = {}
    try:
        with private_redis(wrapper, start_s=60.0) as url:
            client = redis.Redis.from_url(url, socket_timeout=60)
            try:
                pid = str(client.info("server")["process_id"])
                shas = {c.name: client.script_load(c.source) for c in all_cases}
                for case in all_cases:  # warm, as measure() does
                    _run(client, shas[case.name], case, 300)
                for case in all_cases:
                    _callgrind(pid, "--zero")
                    _run(client, shas[case.name], case, calls)
                    _callgrind(pid, "--dump")
                    found[case.name] = _dumped_instructions(outdir) / calls
            finally:
                client.close()
    finally:
        shutil.rmtree(outdir, ignore_errors=True)
    return found


def _callgrind(pid: str, what: str) -> None:
    done = subprocess.run(
        ["callgrind_control", what, pid], capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"callgrind_control {what} {pid} failed: {done.stderr or done.stdout}")


def _dumped_instructions(outdir: Path) -> float:
    """The instructions of the newest callgrind dump (its ``summary:`` line)."""
    newest = max(outdir.glob("callgrind.out.*"), key=os.path.getmtime)
    for line in newest.read_text(errors="replace").splitlines():
        if line.startswith("summary:"):
            return float(line.split()[1])
    raise SystemExit(f"{newest}: no summary line")


def instruction_rows(group: list[Case], found: dict[str, float]) -> list[list[str]]:
    """One row per case: instructions per call, and the ratio to its baseline."""
    out = []
    for case in group:
        against, ratio = "-", "-"
        if case.against is not None:
            against, ratio = case.against, f"{found[case.name] / found[case.against]:.2f}x"
        out.append([case.name, f"{found[case.name]:,.0f}", against, ratio])
    return out


#: Prefix of the keys of ``measure``'s result that hold the process's CPU per call.
PROCESS = "process:"


def _cpu_s(client: redis.Redis) -> float:
    """CPU seconds the Redis process has used (user + system, all its threads)."""
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def _run(client: redis.Redis, sha: str, case: Case, calls: int) -> None:
    done = 0
    while done < calls:
        n = min(PIPELINE, calls - done)
        pipe = client.pipeline(transaction=False)
        for _ in range(n):
            pipe.evalsha(sha, case.numkeys, *case.keys_and_args)
        last = pipe.execute()[-1]
        if case.source in DECISIONS and parse_reply(last).allowed is not True:
            raise SystemExit(f"{case.name}: refused ({last}); the limit should be huge")
        done += n


def rows(group: list[Case], found: dict[str, list[float]]) -> list[list[str]]:
    """One row per case: median and lowest µs per call, and the ratios to its baseline."""
    out = []
    for case in group:
        median, low = statistics.median(found[case.name]), min(found[case.name])
        against, ratio = "-", "-"
        if case.against is not None:
            base = found[case.against]
            against = case.against
            ratio = f"{median / statistics.median(base):.2f}x ({low / min(base):.2f}x)"
        process = statistics.median(found[PROCESS + case.name])
        out.append(
            [
                case.name,
                f"{median:.1f}",
                f"{low:.1f}",
                f"{process:.1f}",
                f"{1e6 / median:,.0f}",
                against,
                ratio,
            ]
        )
    return out


HEADERS = [
    "script",
    "us/call (median)",
    "lowest",
    "process CPU us/call",
    "calls/s of one core",
    "baseline",
    "x baseline (lowest)",
]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument(
        "--calls",
        type=int_at_least(PIPELINE),
        default=2000,
        help=f"calls per cell and repeat (at least {PIPELINE}, one pipeline)",
    )
    parser.add_argument(
        "--repeats", type=positive_int, default=7, help="interleaved repeats per cell"
    )
    parser.add_argument("--redis-url", help="an existing Redis instead of a private one")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="also count instructions per call under callgrind (needs valgrind)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure and print both tables; 130 when interrupted."""
    args = parse_args(argv)
    if args.redis_url:
        reachable_redis(args.redis_url)
    signal.signal(signal.SIGTERM, raise_interrupt)
    began = time.monotonic()
    try:
        with ExitStack() as stack:
            url = args.redis_url or stack.enter_context(private_redis())
            client = redis.Redis.from_url(url, socket_timeout=10)
            stack.callback(client.close)
            prefix = f"gwlserver{uuid.uuid4().hex[:8]}"
            stack.callback(delete_keys, client, f"{prefix}*")
            facts = machine_facts(
                client, url, private=not args.redis_url, peers=False, metrics=False
            )
            for line in facts:
                print(line)
            print(f"plan:     {args.calls} calls per cell x {args.repeats} interleaved repeats")
            print(flush=True)
            one, several = cases(prefix)
            found = measure(client, one + several, args.calls, args.repeats)
            print(
                "1. Redis server time per call: bucket.lua, pushback.lua, heartbeat (commandstats)"
            )
            print(table(HEADERS, rows(one, found)))
            print(flush=True)
            print("2. Redis server time per call: limits.lua against its own minimal commands")
            print(table(HEADERS, rows(several, found)))
            print(
                "us/call: cmdstat_evalsha usec / calls after CONFIG RESETSTAT (median and "
                "lowest of the repeats).\nprocess CPU: INFO cpu (user + sys) of the whole "
                "Redis process per call, median; it adds reading and answering the commands "
                "(in pipelines of 100 here) and the INFO calls themselves.\ncalls/s of one "
                "core: 1e6 / median, what one Redis core could run of that script alone."
                "\nx baseline: median / the baseline's median (lowest / the baseline's lowest)."
            )
            if args.instructions:
                print(flush=True)
                counted = count_instructions(one + several, max(PIPELINE, args.calls // 4))
                print("3. Instructions per call inside EVALSHA (callgrind, a private server)")
                print(
                    table(
                        ["script", "instructions/call", "baseline", "x baseline"],
                        instruction_rows(one + several, counted),
                    )
                )
    except KeyboardInterrupt:
        print("\ninterrupted; cleaned up", file=sys.stderr)
        return 130
    print(f"\n(run took {time.monotonic() - began:.1f} s; load average now {load_average()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
