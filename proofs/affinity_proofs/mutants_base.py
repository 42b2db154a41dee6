"""The machinery of the core's mutants: patching, the :class:`Mutant` record, keep wrappers.

Theory of operation
-------------------
A mutant is a context manager that monkeypatches the real core while it is applied
(:func:`patched` sets a module attribute or a dict entry and restores it afterwards).
:func:`_keep_patch` installs a replacement keep rule where the machine calls it
(``machine.keep_pin``) and where other callers hold their own reference
(``policy.keep_pin``). The catalogues live in :mod:`.mutants` (the BFS controls),
:mod:`.mutants_band` (the context band's) and :mod:`.mutants_beyond` (those only wide
checks see); a crash inside any of these modules is a control that no longer fits the
core (``control inconclusive``, :mod:`.bfs`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs

import affinity_engine.machine as machine
import affinity_engine.policy as policy
from affinity_engine import Config

__all__ = ["Mutant", "Patch", "allowed_mod", "patched"]

# ``affinity_engine.allowed`` the attribute is the function (re-exported by the package);
# the module has to be fetched by name.
allowed_mod = importlib.import_module("affinity_engine.allowed")

Patch = Callable[[], Iterator[None]]


@contextmanager
def patched(target: Any, name: Any, value: Any) -> Iterator[None]:
    """Set ``target.name`` (or ``target[name]`` for a dict) to ``value``, then restore."""
    is_dict = isinstance(target, dict)
    original = target[name] if is_dict else getattr(target, name)
    if is_dict:
        target[name] = value
    else:
        setattr(target, name, value)
    try:
        yield
    finally:
        if is_dict:
            target[name] = original
        else:
            setattr(target, name, original)


@attrs.frozen
class Mutant:
    name: str
    description: str
    obligations: tuple[int, ...]  # the obligations whose checkers must refute it
    patch: Patch
    # The mutant's own code is the broken core and raises by design (a crash of step is
    # its refutation, R-OUT-1); for every other mutant a crash in this module is a
    # control that no longer fits the core ("control inconclusive").
    raises_by_design: bool = False

    @contextmanager
    def applied(self) -> Iterator[None]:
        with contextmanager(self.patch)():
            yield


_ORIGINAL_KEEP = policy.keep_pin


def _keep_patch(keep: Callable[..., bool]) -> Patch:
    def patch() -> Iterator[None]:
        with patched(machine, "keep_pin", keep), patched(policy, "keep_pin", keep):
            yield

    return patch


def _with_margin(config: Config, margin: int | None) -> Config:
    """``config`` with another margin. With the context band the cap grows to stay >= the
    margin (R-CFG-6), and margin None drops the band, which needs a margin."""
    if config.affinity_break_tokens is None:
        return attrs.evolve(config, affinity_break_margin=margin)
    if margin is None:
        return attrs.evolve(config, affinity_break_margin=None, affinity_break_tokens=None,
                            affinity_break_band_cap=None)
    cap = max(config.affinity_break_band_cap or 1, margin, 1)
    return attrs.evolve(config, affinity_break_margin=margin, affinity_break_band_cap=cap)


def _margin_case(config: Config) -> int | None:
    """The margin when the margin rule applies (margin set, not deterministic)."""
    if config.full_determinism:
        return None
    return config.affinity_break_margin
