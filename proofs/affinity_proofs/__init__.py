"""affinity_proofs: the proof suite behind ``affinity verify``.

Every obligation of proofs/README.md is checked by one or more methods on the *real*
engine (:mod:`affinity_engine`, which obligation 21 proves refines the reference
:mod:`affinity_core`) or on a Z3 encoding that is cross-checked against it:

* :mod:`.z3_param` / :mod:`.z3_param_lemmas` / :mod:`.z3_band_lemmas`: the rules' lemmas
  and induction steps for every pool size N;
* :mod:`.z3_model` / :mod:`.z3_lemmas` / :mod:`.z3_bmc`: the bounded encoding, for what has
  no all-N form -- the witnesses of two facts and bounded model checking over releases;
  :mod:`.conformance` and :mod:`.conformance_wide` keep both encodings honest;
* :mod:`.z3_mutants`: the encoded mutants -- the spec's pieces with one replaced -- and the
  lemmas that refute each (the two encodings above state the spec only);
* :mod:`.refinement`: the engine against the reference on wide traces and every vector;
* :mod:`.bfs` / :mod:`.bfs_checks`: explicit-state breadth-first model checking over all
  interleavings at small scopes, calling ``affinity_engine.step`` and the named predicates
  of ``affinity_conformance.invariants`` on every edge;
* :mod:`.contracts` / :mod:`.crosshair_run`: CrossHair contracts and ``diffbehavior``;
* :mod:`.det_trace`: cross-process determinism under different ``PYTHONHASHSEED``;
* :mod:`.mutants`: the negative controls, applied to the real core by monkeypatching.

:mod:`.cli` wires them into ``affinity verify``.
"""

__all__: list[str] = []
