"""Reusable widgets (no engine knowledge)."""
