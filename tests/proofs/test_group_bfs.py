"""The group-pin BFS explores a finite space, holds on the reference, and refutes every
mutant transition with the check that names it."""

from __future__ import annotations

from affinity_proofs import bfs_groups


def test_every_configuration_is_explored_without_a_violation() -> None:
    for gc in bfs_groups.CONFIGS:
        explored = bfs_groups.explore(gc)
        assert explored.violation is None, (gc.label, explored.violation)
        assert explored.states > 100, gc.label
        assert all(count > 0 for count in explored.applied.values()), explored.applied


def test_each_mutant_is_refuted_by_its_own_check() -> None:
    for name, (mutant, expected, _) in bfs_groups.MUTANTS.items():
        found = [bfs_groups.explore(gc, mutant).violation for gc in bfs_groups.CONFIGS]
        assert any(v is not None and v[0] == expected for v in found), (name, found)


def test_the_job_rows_pass_and_name_the_reference() -> None:
    rows = bfs_groups.group_bfs_job()
    assert {row.obligation for row in rows} == {3, 8, 10}
    for row in rows:
        assert row.passed, row.detail
        assert row.mutants and all(m.refuted for m in row.mutants)
        assert row.package == "affinity_core"
