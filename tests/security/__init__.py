"""Hostile input (API arguments, rows, argv), no SQL from strings, secrets never shown."""
