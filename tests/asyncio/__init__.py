"""The asyncio limiter: routing, rate under load, a free loop, cancelled callers, outages."""
