"""``envoy.service.ratelimit.v3.RateLimitService`` and the gRPC health service, served by
``RlsServer`` on loopback and asked by a real gRPC client: answers, bad input, and the
failure policy while Redis is away (``gateway_limiter/rls/server.py``)."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy import Engine

from gateway_limiter.config.settings import load_settings
from gateway_limiter.rls.server import SERVICE, RlsServer, serve_until_signalled
from tests.support.limiting import write_row
from tests.support.services import RedisServer
from tests.support.waiting import wait_for_async

HOUR = 3600
OK, OVER = rls_pb2.RateLimitResponse.OK, rls_pb2.RateLimitResponse.OVER_LIMIT


@pytest.fixture
def db(migrated_db: tuple[str, Engine]) -> tuple[str, Engine]:
    engine = migrated_db[1]
    write_row(engine, "/a", rateLimit=2, periodSeconds=HOUR, cache=0.0)
    write_row(engine, "/ten", rateLimit=5, periodSeconds=10, cache=0.0)
    return migrated_db


async def serving(db: str, redis_url: str, key_prefix: str, **more: Any) -> RlsServer:
    settings = load_settings(
        None,
        environ={},
        database_url=db,
        redis_url=redis_url,
        key_prefix=key_prefix,
        reload_interval=3600,
        **more,
    )
    return await RlsServer(settings, "127.0.0.1:0").start()


@pytest.fixture
async def server(
    db: tuple[str, Engine], redis_server: RedisServer, key_prefix: str
) -> AsyncIterator[RlsServer]:
    running = await serving(db[0], redis_server.url, key_prefix)
    yield running
    await running.stop(0.5)


def request(*descriptors: dict[str, str], domain: str = "egress", hits: int = 0) -> Any:
    return rls_pb2.RateLimitRequest(
        domain=domain,
        hits_addend=hits,
        descriptors=[
            ratelimit_pb2.RateLimitDescriptor(
                entries=[
                    ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in d.items()
                ]
            )
            for d in descriptors
        ],
    )


async def ask(port: int, req: Any) -> Any:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        return await rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(req, timeout=5)


async def test_health_and_answers(server: RlsServer) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", SERVICE):
            reply = await health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
    first = await ask(server.port, request({"interface": "/a"}, {"interface": "/none"}))
    assert first.overall_code == OK
    assert [s.code for s in first.statuses] == [OK, OK]
    limit = first.statuses[0].current_limit
    assert (limit.requests_per_unit, limit.unit) == (2, rls_pb2.RateLimitResponse.RateLimit.HOUR)
    assert first.statuses[0].limit_remaining == 1
    assert not first.statuses[1].HasField("current_limit")  # no row: OK, as Envoy expects
    headers = {h.key: h.value for h in first.response_headers_to_add}
    assert headers["X-RateLimit-Remaining"] == "1"
    assert headers["X-RateLimit-Decided-By"] == "redis"
    # hits_addend are the permits: two more than the one left
    over = await ask(server.port, request({"interface": "/a"}, hits=2))
    assert over.overall_code == OVER and over.statuses[0].code == OVER
    assert over.statuses[0].duration_until_reset.seconds > 1000
    headers = {h.key: h.value for h in over.response_headers_to_add}
    assert int(headers["Retry-After"]) > 1000
    # 5 per 10 s: no Envoy unit says it; the nearest, a minute, scaled and rounded down
    ten = await ask(server.port, request({"interface": "/ten"}))
    limit = ten.statuses[0].current_limit
    assert (limit.requests_per_unit, limit.unit) == (30, rls_pb2.RateLimitResponse.RateLimit.MINUTE)
    assert "5 per 10 s" in limit.name


@pytest.mark.parametrize(
    ("req", "named"),
    [
        (request({"interface": "/a"}, domain=""), "domain is empty"),
        (request({"interface": ""}), "descriptor 1: entry 'interface' has no value"),
        (request({"interface": "/a"}, {"caller": ""}), "descriptor 2: entry 'caller' has no value"),
        (request({"interface": "/a"}, hits=2**31), "hits_addend 2147483648"),
    ],
)
async def test_bad_input_is_invalid_argument_and_never_reaches_redis(
    db: tuple[str, Engine], private_redis: RedisServer, key_prefix: str, req: Any, named: str
) -> None:
    running = await serving(db[0], private_redis.url, key_prefix)
    try:
        client = private_redis.client()
        calls_before = client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await ask(running.port, req)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert named in (caught.value.details() or "")
        calls_after = client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
        assert calls_after == calls_before
        assert client.keys(f"{key_prefix}:{{/a}}*") == []
    finally:
        await running.stop(0.5)


async def test_a_descriptors_own_hits_addend_beyond_the_limit(server: RlsServer) -> None:
    req = request({"interface": "/a"})
    req.descriptors[0].hits_addend.value = 2**31
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await ask(server.port, req)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "descriptor 1: hits_addend" in (caught.value.details() or "")


@pytest.mark.parametrize(("policy", "code"), [("allow", OK), ("deny", OVER)])
async def test_redis_away_the_failure_policy_decides_and_says_so(
    db: tuple[str, Engine], private_redis: RedisServer, key_prefix: str, policy: str, code: int
) -> None:
    running = await serving(
        db[0], private_redis.url, key_prefix, on_backend_error=policy, redis_timeout=0.2
    )
    try:
        assert (await ask(running.port, request({"interface": "/a"}))).overall_code == OK
        private_redis.kill()
        # two interfaces: the one script call fails, and the policy decides each
        away = await ask(running.port, request({"interface": "/a"}, {"interface": "/ten"}))
        assert away.overall_code == code
        assert [s.code for s in away.statuses] == [code, code]
        headers = {h.key: h.value for h in away.response_headers_to_add}
        assert headers["X-RateLimit-Decided-By"] == f"on_backend_error:{policy}"
    finally:
        await running.stop(0.5)


async def test_the_domain_names_the_channel_when_asked(
    migrated_db: tuple[str, Engine], redis_server: RedisServer, key_prefix: str
) -> None:
    engine = migrated_db[1]
    write_row(engine, "/ch", rateLimit=100, channelType="IBE", cache=0.0)
    write_row(engine, "*", rateLimit=1, periodSeconds=HOUR, channelType="IBE", cache=0.0)
    running = await serving(migrated_db[0], redis_server.url, key_prefix, rls_domain_channel=True)
    try:
        # another domain: not that channel's traffic, not limited by it
        for _ in range(3):
            other = await ask(running.port, request({"interface": "/ch"}, domain="OTHER"))
            assert other.overall_code == OK and not other.statuses[0].HasField("current_limit")
        ibe = request({"interface": "/ch"}, domain="IBE")
        assert (await ask(running.port, ibe)).overall_code == OK
        assert (await ask(running.port, ibe)).overall_code == OVER
    finally:
        await running.stop(0.5)


def sample(name: str, **labels: str) -> float:
    import prometheus_client

    return prometheus_client.REGISTRY.get_sample_value(name, labels) or 0.0


async def test_its_metrics_count_requests_by_code_and_time_them(server: RlsServer) -> None:
    before = {
        code: sample("gateway_limiter_rls_requests_total", code=code)
        for code in ("ok", "over_limit", "invalid_argument")
    }
    timed = sample("gateway_limiter_rls_request_seconds_count")
    await ask(server.port, request({"interface": "/a"}))
    await ask(server.port, request({"interface": "/a"}, hits=5))
    with pytest.raises(grpc.aio.AioRpcError):
        await ask(server.port, request({"interface": "/a"}, domain=""))
    for code, count in before.items():
        assert sample("gateway_limiter_rls_requests_total", code=code) == count + 1
    assert sample("gateway_limiter_rls_request_seconds_count") == timed + 3
    # the limiter's own metrics, as in any process
    refused = {"interface": "/a", "outcome": "refused", "reason": "limited", "priority": "default"}
    assert sample("gateway_limiter_decisions_total", **refused) >= 1


async def test_a_call_its_caller_gives_up_on_is_counted_cancelled_not_an_error(
    db: tuple[str, Engine], private_redis: RedisServer, key_prefix: str
) -> None:
    running = await serving(
        db[0], private_redis.url, key_prefix, redis_timeout=3.0, redis_timeout_ceiling=3.0
    )
    try:
        assert (await ask(running.port, request({"interface": "/a"}))).overall_code == OK
        counts = ("cancelled", "error")
        before = {c: sample("gateway_limiter_rls_requests_total", code=c) for c in counts}
        errors = sample("gateway_limiter_rls_errors_total")
        private_redis.client().client_pause(1500)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as gave_up:  # as Envoy's timeout does
                await rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(
                    request({"interface": "/a"}), timeout=0.3
                )
        assert gave_up.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await wait_for_async(  # the service hears of it on its own time
            lambda: (
                sample("gateway_limiter_rls_requests_total", code="cancelled") > before["cancelled"]
            ),
            5,
            "the cancelled call counted",
        )
        assert sample("gateway_limiter_rls_requests_total", code="cancelled") == (
            before["cancelled"] + 1
        )
        assert sample("gateway_limiter_rls_requests_total", code="error") == before["error"]
        assert sample("gateway_limiter_rls_errors_total") == errors
    finally:
        await running.stop(0.5)


async def stop_begun(port: int) -> bool:
    """The service on ``port`` began to stop: its health check answers NOT_SERVING (the
    first thing ``stop`` does, going on at once to refuse new calls), or is refused
    (UNAVAILABLE). Any other failure (a deadline missed on a loaded host) says nothing."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        try:
            reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=1)
        except grpc.aio.AioRpcError as e:
            return bool(e.code() == grpc.StatusCode.UNAVAILABLE)
    return bool(reply.status == health_pb2.HealthCheckResponse.NOT_SERVING)


async def test_stopping_lets_the_calls_in_flight_finish(
    db: tuple[str, Engine], private_redis: RedisServer, key_prefix: str
) -> None:
    running = await serving(
        db[0], private_redis.url, key_prefix, redis_timeout=3.0, redis_timeout_ceiling=3.0
    )
    port = running.port
    assert (await ask(port, request({"interface": "/a"}))).overall_code == OK
    private_redis.client().client_pause(1500)
    in_flight = asyncio.create_task(ask(port, request({"interface": "/a"})))
    lanes = running.limiter.backend._lanes  # type: ignore[attr-defined]
    await wait_for_async(  # the call waits for Redis inside the service: sent, unanswered
        lambda: lanes._active > 0 and not lanes._collecting and not lanes._queue,
        5,
        "the call in flight to the paused Redis",
    )
    stopping = asyncio.create_task(running.stop(5.0))
    deadline = asyncio.get_running_loop().time() + 5
    while not await stop_begun(port):  # the health service says so, or stop refuses it
        assert asyncio.get_running_loop().time() < deadline, "the service never began to stop"
        await asyncio.sleep(0.01)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:  # no new calls while it stops
            await rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(
                request({"interface": "/a"}), timeout=2
            )
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
    answered = await in_flight  # decided by Redis once the pause ends
    assert answered.overall_code == OK
    headers = {h.key: h.value for h in answered.response_headers_to_add}
    assert headers["X-RateLimit-Decided-By"] == "redis"
    await stopping


async def test_the_command_puts_what_it_made_starting_out_of_the_collectors_sight(
    db: tuple[str, Engine], redis_server: RedisServer, key_prefix: str
) -> None:
    settings = load_settings(
        None, environ={}, database_url=db[0], redis_url=redis_server.url, key_prefix=key_prefix
    )
    before = gc.get_freeze_count()
    frozen: list[int] = []

    def ready(server: RlsServer) -> None:
        frozen.append(gc.get_freeze_count())
        os.kill(os.getpid(), signal.SIGTERM)  # stops it, as the command is stopped

    try:
        await asyncio.wait_for(serve_until_signalled(settings, "127.0.0.1:0", ready), 20)
    finally:
        gc.unfreeze()
    # the modules, the table, the server: thousands of objects the collector no longer scans
    assert frozen and frozen[0] > before + 1000
