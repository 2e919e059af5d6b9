"""The patch-set tools behind scripts/patchset.py (its docstring describes them)."""
