"""Embedded data files: the default policy."""
