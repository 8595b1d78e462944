"""The wait-or-refuse guide's ``decide`` example runs as written: its block is executed unchanged,
and its ``flight_search`` answers 200 or 429 with the rate-limit headers, on a real
Redis and MariaDB."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from tests.support.limiting import limiter, write_row
from tests.support.services import RedisServer

PAGE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "wait-or-refuse.md"


def decide_block() -> str:
    """The python block of the guide's "Decide, and say why" section."""
    text = PAGE.read_text(encoding="utf-8")
    section = text.split("\n## Decide, and say why\n", 1)[1].split("\n## ")[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert len(blocks) == 1, "the decide section should hold exactly one python block"
    return str(blocks[0])


def test_decide_example_answers_429_with_headers(
    migrated_db: tuple[str, Engine], redis_server: RedisServer, key_prefix: str
) -> None:
    db, engine = migrated_db
    write_row(engine, "/ibe/flight/search", rateLimit=2, cache=0.0, status=1)
    calls: list[dict[str, str]] = []
    namespace: dict[str, Any] = {"__name__": "readme_example"}
    exec(compile(decide_block(), str(PAGE), "exec"), namespace)

    def call_supplier(query: dict[str, str]) -> int:
        calls.append(query)
        return 200

    namespace["call_supplier"] = call_supplier  # the one name the block leaves to its reader

    lim = limiter(db, redis_server.url, key_prefix)
    try:
        answers = [namespace["flight_search"](lim, {"from": "SHA"}) for _ in range(3)]
    finally:
        lim.close()
    assert answers == [
        (200, {"X-RateLimit-Limit": "2", "X-RateLimit-Remaining": "1"}),
        (200, {"X-RateLimit-Limit": "2", "X-RateLimit-Remaining": "0"}),
        (429, {"X-RateLimit-Limit": "2", "X-RateLimit-Remaining": "0", "Retry-After": "1"}),
    ]
    assert calls == [{"from": "SHA"}] * 2
