"""Fixtures: kube (being built)."""
