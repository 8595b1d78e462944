"""Settings, limit rows, the reload that follows the table, migrations."""
