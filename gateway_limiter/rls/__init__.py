"""Envoy's rate limit service, served from the limits table (``gateway-limiter rls``).

Envoy (and Istio, Contour, Envoy Gateway) asks a rate limit service over gRPC
(``envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit``) before each request.
This package answers it from the same table, Redis buckets and failure policy as a
Python ``AsyncGatewayLimiter`` (extra ``rls``: grpcio, grpcio-health-checking,
xds-protos), so Envoy proxies and Python gateways share one set of limits:

- ``descriptors.py``: a request's domain and descriptors read as interfaces, callers and
  permits (the settings ``rls_interface_entry``, ``rls_caller_entry``,
  ``rls_domain_channel``), and the bad input answered ``INVALID_ARGUMENT``;
- ``judge.py``: every descriptor of a request decided together, all or nothing, on the
  limiter (one script call, ``backends/descriptors.lua``, for several interfaces);
- ``answers.py``: what Envoy is told: codes, ``current_limit`` in Envoy's units,
  remaining, reset, and the response headers;
- ``server.py``: the grpc.aio server, the health service, its metrics, and
  ``run_rls`` (what the command runs). Only this module imports grpc and the protos.

docs/envoy.md has the Envoy configuration the tests run and what the protocol cannot say.
"""
