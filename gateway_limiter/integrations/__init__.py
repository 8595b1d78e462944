"""Integrations: the limiter at the seams of HTTP clients and servers (optional extras).

Clients decide before each request, raise ``Refused`` when refused, and push back after
a 429 or 503: ``httpx`` (``LimiterTransport``, ``AsyncLimiterTransport``), ``requests``
(``LimiterAdapter``), ``aiohttp`` (``LimiterMiddleware``). A gateway limiting its own
callers: ``asgi`` (``RateLimitMiddleware``). Each module imports only its framework.
"""
