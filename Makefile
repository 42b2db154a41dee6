# The inner loop (docs/inner-loop.md). `make check` runs in under two minutes on a loaded
# two-core machine: lint, types, the core, the proofs at small scope and the conformance
# tier. The slow and environment tiers (ray, vllm, peers, compiled) are left to
# scripts/test.sh and CI. VENV defaults to the checkout's .venv (scripts/test.sh makes it).
VENV ?= .venv
PY ?= $(VENV)/bin/python
MYPY_DIRS = affinity_core affinity_engine affinity_runtime affinity_cli affinity_conformance adapters proofs sim tests benchmarks
FAST_MARKERS = not slow and not ray and not vllm and not peers and not compiled
PYTEST = $(PY) -m pytest -q -p no:cacheprovider

.PHONY: check lint typecheck test-fast proofs-small

check: lint typecheck test-fast proofs-small

lint:
	$(PY) -m ruff check .

typecheck:
	$(PY) -m mypy $(MYPY_DIRS)

# The core and the conformance tier (vectors, affinity check, the Node consumer, verl's
# class by refinement) in one pytest process.
test-fast:
	$(PYTEST) -x -m "$(FAST_MARKERS)" tests/core tests/conformance

proofs-small:
	$(PY) -m affinity_cli.main verify --scope small
