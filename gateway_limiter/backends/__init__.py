"""Where bucket state lives: Redis (single, Cluster, Sentinel) or in-process memory.

base.py says what a backend is, schemes.py picks one by the scheme of redis_url,
and each storage module holds its threaded and asyncio implementation.
"""
