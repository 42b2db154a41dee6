"""Obligation 19's input tables: event validation (R-EV-2), the encoding's round trip
(R-CODEC-1) and the derived configuration flags (R-BAND-5), each clean on the core and
each refuting its own control (the second independent mutant audit's survivors)."""

from __future__ import annotations

from affinity_proofs import input_table
from affinity_proofs.jobs_tables import input_rows
from affinity_proofs.mutants import by_name

from affinity_engine import Acquire, Config
from affinity_engine.codec import event_from_json, event_to_json


def test_event_table_is_exact_and_sees_its_control() -> None:
    checked, problems = input_table.check_events()
    assert checked >= 100 and problems == []
    with by_name("tie_draw_negative_accepted").applied():
        _, found = input_table.check_events()
    assert any("tie_draw=-1 accepted" in p for p in found)
    assert input_table.check_events() == (checked, [])  # the control was undone


def test_codec_round_trip_is_exact_and_sees_its_control() -> None:
    checked, problems = input_table.check_codec()
    assert checked >= 300 and problems == []
    with by_name("request_hash_zero_not_encoded").applied():
        _, found = input_table.check_codec()
    assert any("request_hash must be present" in p for p in found)


def test_derived_flags_and_their_control() -> None:
    assert input_table.check_derived()[1] == []
    with by_name("context_band_under_determinism").applied():
        _, found = input_table.check_derived()
    assert found and "full_determinism=True" in found[0]


def test_the_rows_pass_and_name_their_requirements() -> None:
    rows = input_rows()
    assert [r.method for r in rows] == ["event edge-value table", "encoding round trip",
                                        "derived configuration flags",
                                        "unread acquire inputs", "configuration defaults"]
    assert all(r.passed and r.obligation == 19 for r in rows)
    assert {"R-EV-2", "R-CODEC-1", "R-BAND-5"} <= {i for r in rows for i in r.requirements}


def test_the_tables_speak_spec_not_the_code() -> None:
    """A few rows restated from SPEC, so a table edit cannot drift: R-CODEC-1 omits only
    the defaults (tie_draw 0, null), so a caller hash of 0 is written and read back."""
    event = Acquire(request_id="r", request_hash=0, context_tokens=0)
    assert event_to_json(event) == {"op": "acquire", "request_id": "r", "request_hash": 0,
                                    "context_tokens": 0}
    assert event_from_json(event_to_json(event)) == event
    band = Config(affinity_break_margin=1, affinity_break_tokens=4, affinity_break_band_cap=3,
                  full_determinism=True)
    assert band.context_band is False  # R-BAND-5: ignored like the margin


def test_draw_for_feedback_and_its_control() -> None:
    """R-REL-2: each allowed server fed back through draw_for is the reference's choice."""
    from affinity_proofs import refinement_table
    from affinity_proofs.jobs_tables import _feedback_row

    checked, failures = refinement_table.check_feedback(narrow_max=2)
    assert checked > 1000 and failures == []
    with by_name("draw_for_next_tie").applied():
        _, found = refinement_table.check_feedback(narrow_max=2)
    assert found and "R-REL-2" in found[0]
    row = _feedback_row()
    assert row.obligation == 0 and row.passed and "R-REL-2" in row.requirements


def test_every_predicate_has_a_violation_exhibit() -> None:
    """R-ST-2, R-LEASE-5: each named predicate is false on its violation; a vacuous
    leases_match_loads (the audit's survivor) is seen."""
    from affinity_proofs import predicate_table

    import affinity_conformance.invariants as inv

    assert predicate_table.check_exhibits()[1] == []
    judged = {name for name, _, expected, _ in predicate_table.EXHIBITS if expected is False}
    # spec_band is the band the predicates read, not a predicate (its own test compares it
    # with the reference's keep_band: tests/conformance/test_invariants_band.py)
    predicates = {n for n in inv.__all__ if n not in {"Ledger", "legacy_projection", "project",
                                                      "spec_band", "step_invariants"}}
    assert judged == predicates
    with by_name("leases_match_loads_vacuous").applied():
        _, found = predicate_table.check_exhibits()
    assert found and "leases_match_loads is True" in found[0]
