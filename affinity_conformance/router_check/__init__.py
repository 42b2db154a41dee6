"""Black-box conformance of HTTP routers (``affinity check-router``).

Modules: :mod:`.fleet` (recording stub backends), :mod:`.presets` (routers and how to
start them), :mod:`.target` (fresh state, settling, pool changes), :mod:`.trace` (ops and
their spec events), :mod:`.harness` (one trace in refinement mode, shrinking, vectors),
:mod:`.explain` (divergences in words, the band decisions a trace met),
:mod:`.runner` (many traces, the report), :mod:`.cli` (the command).
"""

from .claims import Claim, ClaimError, parse_claim
from .fleet import Arrival, RecordingFleet
from .presets import PRESETS, Preset
from .runner import CheckOptions, RouterReport, check_router

__all__ = ["PRESETS", "Arrival", "CheckOptions", "Claim", "ClaimError", "Preset",
           "RecordingFleet", "RouterReport", "check_router", "parse_claim"]
