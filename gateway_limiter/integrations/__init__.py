"""Integrations: the limiter at the seams of HTTP clients and servers (optional extras).

Each module imports its own framework, so ``import gateway_limiter.integrations`` alone
loads none of them; install the extra of the one you use (``gateway-limiter[httpx]``,
``[requests]``, ``[aiohttp]``, ``[asgi]``).

Clients (a gateway calling its supplier) decide before each request, raise
``gateway_limiter.Refused`` without touching the supplier when refused, and tell the
fleet when the supplier answers 429 or 503 (``limiter.pushback``):

- ``integrations.httpx``: ``LimiterTransport``, ``AsyncLimiterTransport``
- ``integrations.requests``: ``LimiterAdapter``
- ``integrations.aiohttp``: ``LimiterMiddleware`` (an aiohttp client middleware)

A server (a gateway limiting its own callers) answers 429 itself:

- ``integrations.asgi``: ``RateLimitMiddleware`` (Starlette, FastAPI, any ASGI app)

What they share, the reading of a supplier's answer, is ``integrations.supplier``.
"""
