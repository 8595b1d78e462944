"""What the tests share: real services, clusters, the fleet of processes, traffic, rows.

Nothing here fakes a server; the fixtures built on these are in tests/conftest.py.
"""
