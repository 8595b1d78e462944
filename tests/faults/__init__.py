"""Outages of Redis and the database, the failure policies, a fleet soak."""
