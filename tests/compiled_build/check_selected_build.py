"""Run by test_compiled_build.py inside the nested pytest (never collected on its own):
proves the suites in that run imported the build it expects."""

from __future__ import annotations

import os

import affinity_core
import affinity_core.loads
import affinity_core.machine


def test_the_expected_build_is_loaded() -> None:
    expected = os.environ["AFFINITY_EXPECT_BUILD"]
    assert expected == affinity_core.BUILD
    compiled = not affinity_core.machine.__file__.endswith(".py")
    assert compiled == (expected == "compiled")
    assert affinity_core.loads.__file__ is not None
    assert ("_native" in affinity_core.loads.__file__) == compiled
