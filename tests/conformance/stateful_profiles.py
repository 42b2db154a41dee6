"""Sizes of the stateful conformance machines per Hypothesis profile.

The CI requirement is at least 2,000 examples x 50 steps (100,000 steps) within
3 minutes, derandomized under ``CI=true`` (Hypothesis's ``ci`` profile); the ``thorough``
profile runs 500,000 steps. ``dev``, the default outside CI (tests/conftest.py), runs small;
``--hypothesis-profile=default`` runs the CI size with random exploration.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

# profile -> (max_examples, stateful_step_count)
STATEFUL_SIZES: dict[str, tuple[int, int]] = {
    "ci": (2000, 50),
    "default": (2000, 50),
    "dev": (200, 50),
    "thorough": (5000, 100),
}


def current_profile() -> str:
    return settings.get_current_profile_name()


def stateful_settings(scale: float = 1.0) -> settings:
    """Settings for a stateful machine under the current profile (``scale`` < 1 for the
    heavier machines that run next to the main one)."""
    name = current_profile()
    examples, steps = STATEFUL_SIZES.get(name, STATEFUL_SIZES["default"])
    return settings(
        settings.get_profile(name),
        max_examples=max(1, int(examples * scale)),
        stateful_step_count=steps,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
