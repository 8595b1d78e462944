"""The bucket and the windows in pure Python: no I/O, no redis, no SQLAlchemy.

Each module mirrors a Lua script in backends/, and tests hold the two to the same answers.
"""
