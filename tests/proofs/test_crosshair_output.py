"""CrossHair's output is judged strictly (formal-methods.md section 7, gotcha 1): an
unmet precondition or a missing verdict fails a contract; only a real counterexample
refutes a mutant."""

from __future__ import annotations

from affinity_proofs.crosshair_run import parse_check, source_ranges

RANGES = {"spec": (10, 20, 2), "mutant": (30, 40, 1)}
FILE = "/x/contracts.py"


def test_confirmed_and_not_confirmed_are_benign() -> None:
    out = f"{FILE}:15: info: Confirmed over all paths.\n{FILE}:16: info: Not confirmed.\n"
    (spec, _), stray = parse_check(out, RANGES)
    assert spec.confirmed_or_open and not stray


def test_unmet_precondition_is_a_failure_not_a_verdict() -> None:
    out = (f"{FILE}:15: info: Not confirmed.\n"
           f"{FILE}:16: info: Unable to meet precondition (possibly a bad contract)\n")
    (spec, _), _ = parse_check(out, RANGES)
    assert not spec.confirmed_or_open
    assert not spec.refuted  # and it does not count as a counterexample either


def test_missing_verdict_is_a_failure() -> None:
    (spec, _), _ = parse_check(f"{FILE}:15: info: Not confirmed.\n", RANGES)
    assert not spec.confirmed_or_open  # two post: lines, one verdict


def test_counterexample_refutes_the_mutant_and_unowned_lines_are_stray() -> None:
    out = (f"{FILE}:33: error: false when calling mutant((0, 1, 1), 2, 1) (which returns "
           "False)\nTraceback (most recent call last):\n")
    (_, mutant), stray = parse_check(out, RANGES)
    assert mutant.refuted
    assert stray == ("Traceback (most recent call last):",)


def test_source_ranges_count_post_lines_of_the_real_wrappers() -> None:
    ranges = source_ranges(["decide_3", "keep_pin_3"])
    assert ranges["decide_3"][2] == 3 and ranges["keep_pin_3"][2] == 1
    assert ranges["decide_3"][0] < ranges["decide_3"][1]
