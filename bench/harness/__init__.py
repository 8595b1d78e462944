"""What the benchmark scripts share, so that each script reads as what it measures.

- ``servers``: private ``redis-server`` processes (one, or a cluster) for a run;
- ``limiters``: a limit table on a temporary SQLite file, a ``GatewayLimiter`` on it,
  the floors (a bare ``EVALSHA``) and the peers (``limits``, ``pyrate-limiter``);
- ``timing``: threads and coroutines calling in a loop, counted, and contention runs;
- ``stats``: percentiles, medians, the most events in any window;
- ``report``: the machine facts every run prints first, and plain-text tables;
- ``args``: what the command lines share (``--help``'s description, option types that
  refuse a count or a duration of 0 or less, one line for a ``--redis-url`` that does
  not answer);
- ``runs``: what surrounds a run (Ctrl-C and ``kill``, counting the limiter's errors,
  removing the run's keys from a shared Redis).
"""
