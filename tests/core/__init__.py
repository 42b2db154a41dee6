"""Literal scenario tests for affinity_engine.

This file exists only so that the test modules can import their shared driver with a
relative import (``from .driver import Run``) that resolves the same way under pytest and
mypy: the venv ships an unrelated top-level ``tests`` package, so absolute imports are
ambiguous.
"""
