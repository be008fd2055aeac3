"""Fixtures: spark (being built)."""
