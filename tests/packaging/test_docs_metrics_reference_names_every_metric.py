"""Every Prometheus metric the code defines is in the metrics reference of the site.

The names are read from the source that defines them (``PREFIX + "name"``, the
``gauge("name", ...)`` families, and names spelt out whole), so a new metric without a
line in docs/reference/metrics.md fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]
REFERENCE = CHECKOUT / "docs" / "reference" / "metrics.md"
DEFINED = re.compile(
    r'\bPREFIX \+ "(\w+)"|\bgauge\(\s*"(\w+)"|"gateway_limiter_(\w+)"', re.MULTILINE
)
NOT_METRICS = {"alembic_version"}  # the migrations' version table


def defined_metrics() -> set[str]:
    names: set[str] = set()
    for source in (CHECKOUT / "gateway_limiter").rglob("*.py"):
        for groups in DEFINED.findall(source.read_text(encoding="utf-8")):
            names.update(g for g in groups if g)
    return names - NOT_METRICS


def test_the_source_defines_the_metrics_it_is_known_to() -> None:
    assert {"decisions", "wait_seconds", "fleet_size", "rls_requests"} <= defined_metrics()


def test_every_metric_has_a_line_in_the_reference() -> None:
    page = REFERENCE.read_text(encoding="utf-8")
    missing = sorted(n for n in defined_metrics() if f"`gateway_limiter_{n}" not in page)
    assert not missing, f"not in {REFERENCE.relative_to(CHECKOUT)}: {missing}"
