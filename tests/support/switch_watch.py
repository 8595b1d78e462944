"""One gateway process following the switch's source, for the fleet test of the switch.

``python -m tests.support.switch_watch DATABASE_URL SWITCH_SOURCE`` starts a
``GatewayLimiter`` (buckets in ``memory://``), prints ``ready on|off`` once it has read
the source, then one line
``switch on|off <time.time()>`` each time the switch changes (a registry listener: the
moment the process swapped it in), until its stdin closes.
"""

from __future__ import annotations

import sys
import time

from gateway_limiter import GatewayLimiter
from gateway_limiter.config.reload import ReloadSummary


def main(database_url: str, switch_source: str) -> None:
    limiter = GatewayLimiter(
        database_url=database_url,
        redis_url="memory://",
        switch_source=switch_source,
        reload_interval=3600,
        switch=False,
    )
    last: list[bool | None] = [None]  # None: not started yet

    def heard(summary: ReloadSummary) -> None:
        now = time.time()
        switch = limiter.registry.snapshot.switch
        if last[0] is not None and switch != last[0]:
            last[0] = switch
            print(f"switch {'on' if switch else 'off'} {now:.6f}", flush=True)

    limiter.registry.listeners.append(heard)
    limiter.start()
    # start() waits 2 s for the first reading; a loaded host may need longer to start
    # three processes at once, and the test flips only once each has read the key.
    if not limiter.registry.wait_for_switch_source(30.0):
        raise SystemExit("the switch's source was never read")
    last[0] = limiter.registry.snapshot.switch
    print(f"ready {'on' if last[0] else 'off'}", flush=True)
    sys.stdin.read()  # until the test closes it
    limiter.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
