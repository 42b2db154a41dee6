"""The Z3 encoding cannot drift from the real core (R-KEEP-1, R-TIE-1, R-REL-1, R-LEG-1).

Hypothesis draws concrete acquires -- loads, sticky situation (miss, hit, pin on a removed
server), margin or PR #6533 gate, full_determinism with a hash index, tie draw -- and
:func:`affinity_proofs.conformance.check_point` evaluates the functional, relational and
legacy Z3 terms on them (``substitute`` + ``simplify``) against ``affinity_engine.step`` and
``affinity_conformance.legacy.legacy_acquire``.
"""

from __future__ import annotations

from fractions import Fraction

from affinity_proofs import conformance
from affinity_proofs.conformance import Point, check_point
from affinity_proofs.mutants import by_name
from hypothesis import given, settings
from hypothesis import strategies as st

from affinity_engine import DualThreshold

ENCODINGS = conformance._Encodings()  # built once: the terms are the expensive part

policies = st.one_of(
    st.tuples(st.none() | st.integers(0, 4), st.none()),
    st.builds(lambda a, rel: (None, DualThreshold(a, rel)), st.integers(-1, 4),
              st.sampled_from([Fraction(1), Fraction(3, 2), Fraction(2)])),
)


@st.composite
def acquires(draw: st.DrawFn) -> Point:
    loads = tuple(draw(st.lists(st.integers(0, 6), min_size=1, max_size=5)))
    n, low = len(loads), min(loads)
    sticky = draw(st.sampled_from(["miss", "hit", "removed"]))
    margin, gate = draw(policies)
    det = draw(st.booleans())
    return Point(loads, sticky, draw(st.integers(0, n - 1)), margin, gate, det,
                 draw(st.integers(0, n - 1)) if det else 0,
                 0 if det else draw(st.integers(0, loads.count(low) - 1)))


@settings(max_examples=300)
@given(acquires())
def test_encodings_agree_with_the_core(point: Point) -> None:
    assert check_point(point, ENCODINGS) is None


def test_boundary_of_the_keep_rule_is_in_the_exhaustive_sweep() -> None:
    """R-KEEP-1: load[pin] == min + m is kept; the sweep contains that case."""
    boundary = Point((1, 0), "hit", 0, 1, None, False, 0, 0)
    assert boundary in set(conformance.points(0))
    assert check_point(boundary, ENCODINGS) is None


def test_a_strict_keep_rule_in_the_core_is_caught_at_the_boundary() -> None:
    """The drift guard can fail: with ``<`` in the core's keep rule the boundary pin is
    broken by the core but kept by the encoding."""
    boundary = Point((1, 0), "hit", 0, 1, None, False, 0, 0)
    with by_name("keep_strict_lt").applied():
        message = check_point(boundary, ENCODINGS)
    assert message is not None and "functional encoding" in message
    assert check_point(boundary, ENCODINGS) is None  # the patch is undone


def test_sweep_finds_no_disagreement_and_counts_its_points() -> None:
    result = conformance.run(sample=20)
    assert result.failures == ()
    assert result.points > 300  # every n <= 2 case plus the sample
