"""Run by test_compiled_build.py inside the nested pytest (never collected on its own):
proves the suites in that run imported the build it expects."""

from __future__ import annotations

import os

import affinity_engine
import affinity_engine.loads
import affinity_engine.machine


def test_the_expected_build_is_loaded() -> None:
    expected = os.environ["AFFINITY_EXPECT_BUILD"]
    assert expected == affinity_engine.BUILD
    compiled = not affinity_engine.machine.__file__.endswith(".py")
    assert compiled == (expected == "compiled")
    assert affinity_engine.loads.__file__ is not None
    assert ("_native" in affinity_engine.loads.__file__) == compiled
