"""affinity_proofs: the proof suite behind ``affinity verify``.

Every obligation of proofs/README.md is checked by one or more methods on the *real*
core (:mod:`affinity_engine`) or on a Z3 encoding that is cross-checked against it:

* :mod:`.z3_model` / :mod:`.z3_lemmas` / :mod:`.z3_bmc`: symbolic one-step lemmas,
  induction and bounded model checking; :mod:`.conformance` keeps the encoding honest;
* :mod:`.bfs` / :mod:`.bfs_checks`: explicit-state breadth-first model checking over all
  interleavings at small scopes, calling ``affinity_engine.step`` and the named predicates
  of ``affinity_conformance.invariants`` on every edge;
* :mod:`.contracts` / :mod:`.crosshair_run`: CrossHair contracts and ``diffbehavior``;
* :mod:`.det_trace`: cross-process determinism under different ``PYTHONHASHSEED``;
* :mod:`.mutants`: the negative controls, applied to the real core by monkeypatching.

:mod:`.cli` wires them into ``affinity verify``.
"""

__all__: list[str] = []
