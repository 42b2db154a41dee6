"""Every all-N lemma, the margin's, the band's and the group pins', by name."""

from __future__ import annotations

from .z3_band_lemmas import BAND_LEMMAS
from .z3_group_lemmas import GROUP_LEMMAS
from .z3_param_kit import ParamLemma
from .z3_param_lemmas import PARAM_LEMMAS
from .z3_prefix_lemmas import PREFIX_LEMMAS

__all__ = ["ALL_N_LEMMAS", "param_lemma"]

ALL_N_LEMMAS: tuple[ParamLemma, ...] = (*PARAM_LEMMAS, *BAND_LEMMAS, *GROUP_LEMMAS,
                                          *PREFIX_LEMMAS)


def param_lemma(name: str) -> ParamLemma:
    """The all-N lemma called ``name``."""
    for lemma in ALL_N_LEMMAS:
        if lemma.name == name:
            return lemma
    raise KeyError(f"unknown all-N lemma {name!r}; known: {[x.name for x in ALL_N_LEMMAS]}")
