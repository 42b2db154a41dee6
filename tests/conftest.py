"""Shared pytest configuration: Hypothesis profiles.

* ``dev`` (default outside CI): no deadline -- several Ray and vLLM processes share this
  machine's two cores, so wall-clock deadlines only produce flaky failures.
* ``ci``: Hypothesis's built-in profile (derandomized, no database, no deadline), loaded
  automatically when ``CI`` is set (``.ci/run`` exports ``CI=true``).
* ``thorough``: the long run (nightly or by hand); the stateful machines scale their
  example counts per profile in ``tests/conformance/stateful_profiles.py``.

Select another with ``pytest --hypothesis-profile=NAME``.
"""

from __future__ import annotations

import os

from hypothesis import settings

# pytester: tests/conformance/test_pytest_plugin.py runs pytest inside pytest.
pytest_plugins = ["pytester"]

settings.register_profile("dev", deadline=None)
settings.register_profile("thorough", deadline=None, max_examples=5000, stateful_step_count=100)
if not os.environ.get("CI"):
    settings.load_profile("dev")
