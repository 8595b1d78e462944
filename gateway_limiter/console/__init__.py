"""The operator console: one web page and a JSON API over the limits table, the switch,
the fleet and the live buckets, with the audit trail of every change.

``gateway-limiter console`` serves it (the ``console`` extra: Starlette, uvicorn,
Jinja2); ``gateway-limiter demo --console`` serves it over the demo. ``app.make_app``
builds the ASGI application from a ``Sources`` (``sources.py``): where the console reads
what it shows, so the same page works over a database and Redis or over the demo's
in-process state. docs/console.md describes the API and its safety rules.
"""
