"""Fusion rule families, one per module; importing this package registers their passes."""

from graphopt.passes.fusion import gelu  # noqa: F401
