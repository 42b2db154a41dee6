# The inner loop (docs/inner-loop.md; its timing is recorded by scripts/time_inner_loop.py):
# lint, types, then the core and conformance tests side by side with the proofs at small
# scope -- the tests are one pytest process and the proofs use two workers, so on a
# two-core machine running them together finishes sooner than running them in turn. The
# slow and environment tiers (ray, vllm, peers, compiled) are left to scripts/test.sh and
# CI. VENV defaults to the checkout's .venv (scripts/test.sh makes it).
VENV ?= .venv
PY ?= $(VENV)/bin/python
MYPY_DIRS = affinity_core affinity_engine affinity_runtime affinity_cli affinity_conformance adapters proofs sim tests benchmarks
FAST_MARKERS = not slow and not ray and not vllm and not peers and not compiled
PYTEST = $(PY) -m pytest -q -p no:cacheprovider

.PHONY: check lint typecheck test-fast proofs-small

# --output-sync=target: each step's output is printed whole when the step ends.
check: lint typecheck
	$(MAKE) --no-print-directory -j2 --output-sync=target test-fast proofs-small

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
