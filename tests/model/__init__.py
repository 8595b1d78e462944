"""The reference model: bucket and window semantics, their properties."""
