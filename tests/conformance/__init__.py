"""Conformance tests: vectors, stateful lockstep, differential against verl, check, replay."""
