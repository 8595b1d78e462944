"""The console's JSON API, over HTTP to a real uvicorn on loopback: rules as the reload
reads them, writes that need the token and are checked as ``conf set`` checks them (the
field named, nothing written on error), each write audited, the switch, and no secret
in any answer."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import Engine, text

from gateway_limiter import GatewayLimiter
from gateway_limiter.config.audit import read_audit
from tests.console.conftest import TOKEN, Served
from tests.support.limiting import write_row

URL = "/ibe/flight/search"


def row_of(engine: Engine, config_id: int) -> dict[str, Any] | None:
    with engine.connect() as conn:
        found = conn.execute(
            text("select * from t_ratelimite_conf where configId = :i"), {"i": config_id}
        ).first()
    return None if found is None else dict(found._mapping)


def test_rules_are_listed_as_the_reload_reads_them(console: Served) -> None:
    good = write_row(console.engine, URL, rateLimit=10, cache=0.5)
    bad = write_row(console.engine, "/ibe/bad", rateLimit=None)
    with console.client(None) as http:
        got = http.get("/api/rules")
    assert got.status_code == 200
    rows = {r["configId"]: r for r in got.json()["rows"]}
    assert rows[good]["interfaceUrl"] == URL
    assert (rows[good]["rateLimit"], rows[good]["cache"], rows[good]["skipped"]) == (10, 0.5, None)
    assert rows[bad]["skipped"] == "rateLimit is NULL"
    assert got.json()["total"] == 2


def test_an_edit_says_what_the_reload_will_ignore_of_it(console: Served) -> None:
    config_id = write_row(console.engine, URL, rateLimit=10, algorithm="sliding_window")
    with console.client() as http:
        leased = http.patch(f"/api/rules/{config_id}", json={"leaseMs": 20})
        plain = http.patch(f"/api/rules/{config_id}", json={"rateLimit": 20, "leaseMs": 0})
    assert leased.status_code == 200, leased.text
    assert leased.json()["warnings"] == [
        f"leaseMs of configId {config_id} ignored on {URL!r}: sliding_window is not "
        "token_bucket (a lease needs one shared, enforced token_bucket row)"
    ]
    assert plain.json()["warnings"] == []


def test_a_new_row_says_what_the_reload_will_ignore_beside_it(console: Served) -> None:
    leased = write_row(console.engine, URL, rateLimit=1000, leaseMs=20, channelType="IBE")
    write_row(console.engine, "/ibe/other", rateLimit=1000, leaseMs=20, channelType="GDS")
    ignored = (
        f"leaseMs of configId {leased} ignored on {URL!r}: the interface has several "
        "limits (or a channel cap) (a lease needs one shared, enforced token_bucket row)"
    )
    with console.client() as http:
        plain = http.post("/api/rules", json={"interfaceUrl": "/ibe/plain", "rateLimit": 5})
        minute = http.post(
            "/api/rules",
            json={"interfaceUrl": URL, "rateLimit": 100, "periodSeconds": 60, "status": 1},
        )
        http.delete(f"/api/rules/{minute.json()['configId']}")
        # a channel cap over the leased interface (disabled, as a new row starts)
        cap = http.post(
            "/api/rules", json={"interfaceUrl": "*", "channelType": "IBE", "rateLimit": 30}
        )
    assert (plain.status_code, minute.status_code, cap.status_code) == (201, 201, 201), cap.text
    # the row as before, with the warnings beside its columns
    assert plain.json()["interfaceUrl"] == "/ibe/plain" and plain.json()["rateLimit"] == 5
    assert plain.json()["warnings"] == []
    assert minute.json()["periodSeconds"] == 60
    assert minute.json()["warnings"] == [ignored]
    assert cap.json()["channelType"] == "IBE"
    # the lease it makes ignored, named with its interface; not another channel's lease
    assert cap.json()["warnings"] == [f"once enabled, {ignored}"]


def test_a_write_needs_the_token(console: Served) -> None:
    config_id = write_row(console.engine, URL, rateLimit=10)
    with console.client(None) as http:
        assert http.patch(f"/api/rules/{config_id}", json={"rateLimit": 40}).status_code == 401
    with console.client("wrong-token-but-long-enough") as http:
        refused = http.patch(f"/api/rules/{config_id}", json={"rateLimit": 40})
    assert refused.status_code == 403
    assert TOKEN not in refused.text
    assert row_of(console.engine, config_id)["rateLimit"] == 10  # type: ignore[index]
    assert read_audit(console.engine) == []


def test_an_edit_changes_the_row_and_the_audit(console: Served) -> None:
    config_id = write_row(console.engine, URL, rateLimit=10)
    with console.client() as http:
        done = http.patch(
            f"/api/rules/{config_id}", json={"rateLimit": 40}, headers={"X-Actor": "alice"}
        )
    assert done.status_code == 200, done.text
    assert (done.json()["before"]["rateLimit"], done.json()["after"]["rateLimit"]) == (10, 40)
    assert row_of(console.engine, config_id)["rateLimit"] == 40  # type: ignore[index]
    latest = read_audit(console.engine)[0]
    assert (latest["actor"], latest["source"], latest["action"]) == ("alice", "console", "update")
    assert (latest["beforeRow"]["rateLimit"], latest["afterRow"]["rateLimit"]) == (10, 40)


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"rateLimit": -1}, 422, "rateLimit"),
        ({"rateLimit": "40"}, 422, "rateLimit"),
        ({"cache": 0.123}, 422, "cache"),
        ({"cache": 12}, 422, "cache"),
        ({"status": 2}, 422, "status"),
        ({"algorithm": "leaky"}, 422, "algorithm"),
        ({"warmupPeriod": 5}, 422, "warmupPeriod"),  # token_bucket has no warm-up
        ({"algorithm": "warm_up"}, 422, "warmupPeriod"),  # warm_up needs one
        ({"maxPermits": 0}, 422, "maxPermits"),
        ({"interfaceUrl": "/x\n"}, 422, "interfaceUrl"),
        ({"periodSeconds": 0}, 422, "periodSeconds"),
        ({"nonsense": 1}, 422, "nonsense"),
        ({"quotaPeriod": "year"}, 422, "quotaPeriod"),
        ({"quotaPeriod": "day", "timeZone": "Mars/Olympus"}, 422, "timeZone"),
        ({"timeZone": "Asia/Shanghai"}, 422, "timeZone"),  # a calendar column, no period
        ({"quotaPeriod": "month", "quotaRenews": "31 00:00"}, 422, "quotaRenews"),
        ({"quotaPeriod": "day", "quotaRenews": "mon 00:00"}, 422, "quotaRenews"),
        ({"quotaPacing": 2}, 422, "quotaPacing"),
    ],
)
def test_a_bad_value_names_its_field_and_writes_nothing(
    console: Served, body: dict[str, Any], status: int, field: str
) -> None:
    config_id = write_row(console.engine, URL, rateLimit=10)
    before = row_of(console.engine, config_id)
    with console.client() as http:
        got = http.patch(f"/api/rules/{config_id}", json=body)
    assert got.status_code == status, got.text
    assert got.json()["field"] == field
    assert field in got.json()["error"]
    assert row_of(console.engine, config_id) == before
    assert read_audit(console.engine) == []


def test_a_body_that_is_not_an_object_is_400(console: Served) -> None:
    config_id = write_row(console.engine, URL, rateLimit=10)
    with console.client() as http:
        assert http.patch(f"/api/rules/{config_id}", content=b"{oops").status_code == 400
        assert http.patch(f"/api/rules/{config_id}", json=[1]).status_code == 400
        assert http.patch("/api/rules/999", json={"rateLimit": 1}).status_code == 404


def test_create_and_delete_a_row(console: Served) -> None:
    with console.client() as http:
        made = http.post("/api/rules", json={"interfaceUrl": URL, "rateLimit": 7, "status": 1})
        assert made.status_code == 201, made.text
        config_id = made.json()["configId"]
        again = http.post("/api/rules", json={"interfaceUrl": URL, "rateLimit": 9})
        assert again.status_code == 409
        assert http.post("/api/rules", json={"interfaceUrl": URL}).json()["field"] == "rateLimit"
        assert row_of(console.engine, config_id)["rateLimit"] == 7  # type: ignore[index]
        gone = http.delete(f"/api/rules/{config_id}")
        assert gone.status_code == 200
        assert http.delete(f"/api/rules/{config_id}").status_code == 404
    assert row_of(console.engine, config_id) is None
    actions = [e["action"] for e in reversed(read_audit(console.engine))]
    assert actions == ["insert", "delete"]


def test_the_switch_on_off_and_back_to_the_setting(console: Served) -> None:
    with console.client() as http:
        assert http.get("/api/switch").json() == {
            "enabled": None,
            "effective": True,
            "source": "settings",
        }
        off = http.put("/api/switch", json={"enabled": False})
        assert off.json() == {"enabled": False, "effective": False, "source": "database"}
        back = http.put("/api/switch", json={"enabled": None})
        assert back.json()["source"] == "settings"
        bad = http.put("/api/switch", json={"enabled": "yes"})
        assert (bad.status_code, bad.json()["field"]) == (422, "enabled")
    assert [e["action"] for e in read_audit(console.engine)] == ["switch", "switch"]


def test_a_console_without_a_token_is_read_only(read_only_console: Served) -> None:
    served = read_only_console
    config_id = write_row(served.engine, URL, rateLimit=10)
    with served.client("any-token-at-all-0123456789") as http:
        assert http.get("/api/rules").status_code == 200
        refused = http.patch(f"/api/rules/{config_id}", json={"rateLimit": 1})
        assert refused.status_code == 403
        assert "read only" in refused.json()["error"]
        assert http.put("/api/switch", json={"enabled": False}).status_code == 403
    with served.client(None) as http:  # no token could make it: 403, not a missing one
        refused = http.delete(f"/api/rules/{config_id}")
        assert refused.status_code == 403 and "read only" in refused.json()["error"]
    assert row_of(served.engine, config_id)["rateLimit"] == 10  # type: ignore[index]


def test_each_channel_gets_its_own_cap_row(console: Served) -> None:
    with console.client() as http:
        cap = {"interfaceUrl": "*", "rateLimit": 30, "status": 1}
        missing = http.post("/api/rules", json=cap)
        assert missing.status_code == 422 and missing.json()["field"] == "channelType"
        first = http.post("/api/rules", json=cap | {"channelType": "IBE+"})
        second = http.post("/api/rules", json=cap | {"channelType": "GDS", "rateLimit": 8})
        assert (first.status_code, second.status_code) == (201, 201), second.text
        again = http.post("/api/rules", json=cap | {"channelType": "GDS"})
        assert again.status_code == 409
    with console.engine.connect() as conn:
        caps = conn.execute(
            text("select channelType, rateLimit from t_ratelimite_conf order by configId")
        ).all()
    assert [tuple(c) for c in caps] == [("IBE+", 30), ("GDS", 8)]


def test_an_unnamed_console_change_says_where_it_came_from(console: Served) -> None:
    config_id = write_row(console.engine, URL, rateLimit=10)
    with console.client() as http:
        assert http.patch(f"/api/rules/{config_id}", json={"rateLimit": 11}).status_code == 200
    assert read_audit(console.engine)[0]["actor"].startswith("127.0.0.1 via ")


def test_a_too_long_caller_key_is_measured_in_its_own_characters(console: Served) -> None:
    config_id = write_row(console.engine, URL, rateLimit=10, perCaller=1)
    with console.client() as http:
        refused = http.patch(f"/api/rules/{config_id}", json={"callerKey": "y" * 65})
    assert refused.status_code == 422 and refused.json()["field"] == "callerKey"
    assert "(65 characters)" in refused.json()["error"]


def test_no_answer_shows_the_token(console: Served) -> None:
    write_row(console.engine, URL, rateLimit=10)
    with console.client() as http:
        answers = [
            http.get(path)
            for path in (
                "/",
                "/api/rules",
                "/api/switch",
                "/api/status",
                "/api/fleet",
                "/api/audit",
            )
        ]
    for answer in answers:
        assert answer.status_code == 200, answer.url
        assert TOKEN not in answer.text
        assert "default-src 'self'" in answer.headers["content-security-policy"]
        assert "set-cookie" not in answer.headers


def test_status_shows_each_limit_and_its_bucket(console: Served) -> None:
    write_row(console.engine, URL, rateLimit=10, cache=0.5)
    with console.client() as http:
        status = http.get("/api/status").json()
    (bucket,) = status["buckets"]
    assert (bucket["url"], bucket["rate"], bucket["shared"]) == (URL, 10, True)
    assert bucket["stored"] is None  # never asked: a full bucket, nothing stored yet
    assert status["switch"]["effective"] is True
    assert status["fleet"]["shared"] is True
    assert (bucket["inFlight"], bucket["maxConcurrent"], bucket["heldMs"]) == (None, None, 0.0)


def test_status_says_a_used_up_calendar_quota_is_spent(console: Served) -> None:
    """A quota with every permit of its period used reads as spent, with its count in
    ``used`` as in ``quota.used``; one with some used is ok, never idle."""
    write_row(console.engine, URL, rateLimit=100, cache=0.0)
    write_row(
        console.engine,
        URL,
        add=True,
        rateLimit=5,
        cache=0.0,
        quotaPeriod="day",
        timeZone="Asia/Shanghai",
    )
    settings = console.settings
    with (
        GatewayLimiter(
            database_url=settings.database_url,
            redis_url=settings.redis_url,
            key_prefix=settings.key_prefix,
            metrics=False,
        ) as gateway,
        console.client() as http,
    ):
        assert sum(gateway.try_acquire(URL, timeout=0) for _ in range(2)) == 2
        some = http.get("/api/status").json()["buckets"][1]
        assert sum(gateway.try_acquire(URL, timeout=0) for _ in range(4)) == 3
        spent = http.get("/api/status").json()["buckets"][1]
    assert (some["condition"], some["used"], some["quota"]["used"]) == ("ok", 2, 2)
    assert some["nextFreeMs"] == 0.0
    assert (spent["condition"], spent["used"], spent["quota"]["used"]) == ("spent", 5, 5)
    assert spent["rate"] == spent["quota"]["limit"] == 5
    renews_ms = (spent["quota"]["renewsAt"] - time.time()) * 1000.0
    assert renews_ms - 60_000 <= spent["nextFreeMs"] <= renews_ms + 60_000


def test_status_names_the_channel_of_a_cap_and_the_caller_of_a_named_row(
    console: Served,
) -> None:
    write_row(console.engine, "/ibe/a", rateLimit=25, channelType="IBE+")
    write_row(console.engine, "*", rateLimit=30, channelType="IBE+")
    write_row(console.engine, "/p", rateLimit=10, perCaller=1)
    write_row(console.engine, "/p", add=True, rateLimit=50, perCaller=1, callerKey="partner-a")
    with console.client() as http:
        buckets = http.get("/api/status").json()["buckets"]
    shown = {(b["url"], b["channelType"], b["callerKey"]) for b in buckets}
    assert ("*", "IBE+", None) in shown
    assert ("/p", None, "partner-a") in shown and ("/p", None, None) in shown


def test_status_shows_slots_in_use_and_what_a_pushback_left(console: Served) -> None:
    """A gateway holding a slot and pushed back: the console reads both from Redis."""
    write_row(console.engine, URL, rateLimit=10, cache=0.5, maxConcurrent=3)
    settings = console.settings
    with (
        GatewayLimiter(
            database_url=settings.database_url,
            redis_url=settings.redis_url,
            key_prefix=settings.key_prefix,
            redis_timeout=2.0,
            redis_timeout_ceiling=2.0,
        ) as gateway,
        gateway.slot(URL, timeout=5),
        console.client() as http,
    ):
        start = time.monotonic()
        gateway.pushback(URL)  # halves the effective rate
        gateway.pushback(URL, retry_after=30)  # and holds every call for 30 s
        status = http.get("/api/status").json()
        took = time.monotonic() - start
    (bucket,) = status["buckets"]
    assert (bucket["inFlight"], bucket["maxConcurrent"]) == (1, 3)
    # From the moment of the pushback the rate recovers by 5 % of the row's (0.5/s here)
    # and the hold runs down: by no more than the time the calls measurably took
    assert 5.0 <= bucket["effectiveRate"] <= 5.0 + 0.5 * took + 0.01
    assert 30_000 - 1000 * took - 2 <= bucket["heldMs"] <= 30_000


def test_a_row_becomes_a_calendar_quota(console: Served) -> None:
    config_id = write_row(console.engine, URL, rateLimit=50_000)
    calendar = {"quotaPeriod": "day", "timeZone": "Asia/Shanghai", "quotaRenews": "02:00"}
    with console.client() as http:
        done = http.patch(f"/api/rules/{config_id}", json=calendar)
        assert done.status_code == 200, done.text
        listed = http.get("/api/rules").json()
    row = next(r for r in listed["rows"] if r["configId"] == config_id)
    assert {k: row[k] for k in calendar} == calendar
    assert row["skipped"] is None
    assert read_audit(console.engine)[0]["afterRow"]["timeZone"] == "Asia/Shanghai"


def test_max_concurrent_zero_clears_the_cap_as_conf_set_does(console: Served) -> None:
    config_id = write_row(console.engine, URL, rateLimit=10, maxConcurrent=4)
    with console.client() as http:
        cleared = http.patch(f"/api/rules/{config_id}", json={"maxConcurrent": 0})
        assert cleared.status_code == 200, cleared.text
        negative = http.patch(f"/api/rules/{config_id}", json={"maxConcurrent": -1})
        assert negative.status_code == 422 and negative.json()["field"] == "maxConcurrent"
    assert row_of(console.engine, config_id)["maxConcurrent"] is None  # type: ignore[index]


def test_lease_ms_is_a_row_field_and_status_shows_it(console: Served) -> None:
    config_id = write_row(console.engine, URL, rateLimit=10, leaseMs=40)
    with console.client() as http:
        listed = http.get("/api/rules").json()
        assert next(r for r in listed["rows"] if r["configId"] == config_id)["leaseMs"] == 40
        cleared = http.patch(f"/api/rules/{config_id}", json={"leaseMs": 0})
        assert cleared.status_code == 200, cleared.text
        absurd = http.patch(f"/api/rules/{config_id}", json={"leaseMs": 60_001})
        assert absurd.status_code == 422 and absurd.json()["field"] == "leaseMs"
        http.patch(f"/api/rules/{config_id}", json={"leaseMs": 25})
        bucket = next(b for b in http.get("/api/status").json()["buckets"] if b["url"] == URL)
        assert bucket["leaseMs"] == 25
    assert row_of(console.engine, config_id)["leaseMs"] == 25  # type: ignore[index]


def test_the_console_refuses_it_unless_told_it_is_a_key(console: Served) -> None:
    with console.client() as http:
        got = http.post(
            "/api/rules", json={"interfaceUrl": "https://supplier.example/sup/full", "rateLimit": 5}
        )
        assert got.status_code == 422, got.text
        assert got.json()["field"] == "interfaceUrl" and "interface=" in got.json()["error"]
        assert row_of(console.engine, 1) is None
        made = http.post(
            "/api/rules", json={"interfaceUrl": "sup/key", "rateLimit": 5, "anyKey": True}
        )
        assert made.status_code == 201, made.text
        config_id = write_row(console.engine, "/sup/ok", rateLimit=5)
        moved = http.patch(f"/api/rules/{config_id}", json={"interfaceUrl": "sup/ok"})
        assert moved.status_code == 422 and moved.json()["field"] == "interfaceUrl"
        kept = http.patch(f"/api/rules/{config_id}", json={"rateLimit": 6})
        assert kept.status_code == 200, kept.text
