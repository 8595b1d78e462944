"""Where limits come from: settings, the table, rows turned into rules, the reload
that keeps them current, and the schema migrations.
"""
