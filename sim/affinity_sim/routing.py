"""Routing policies and the balancer the simulator talks to: the real ``affinity_engine``.

Theory of operation
-------------------
A policy is a name plus the ``affinity_engine.Config`` it stands for; the simulator never
decides a route itself. :class:`Balancer` is a thin wrapper over the adapters' own driver,
:class:`affinity_runtime.RoutingDriver`, which holds the core ``State`` and turns the
simulator's calls into core events exactly as it does for verl and the vLLM router:

* a turn's acquire is ``step(config, state, Acquire(request_id=<trajectory id>,
  tie_draw=<draw>, context_tokens=<prompt length>))``. The trajectory id is reused across
  turns (verl's ToolAgentLoop), which is where sticky hits come from. ``tie_draw`` is
  ``getrandbits(31)`` of the simulation's seeded tie RNG, standing in for verl 0.9.1's
  ``random.choice`` among tied minima; the driver draws it only where the core reads it
  (SPEC R-TIE-5), so ``first`` ties draw nothing. ``context_tokens`` is the turn's whole
  prompt (the conversation so far),
  what an adapter reads from ``prompt_ids``; it is sent under every policy because the
  core ignores it unless the context band is configured (SPEC R-BAND-3);
* least-loaded without stickiness sends ``Acquire(request_id=None)`` (unkeyed);
* a release is ``Release(server_id=...)``, delivered when the simulator says (verl sends
  it fire-and-forget, so it can reach the balancer after the session's next acquire).

Built-in policy names (:func:`parse_policy`):

* ``legacy`` (alias ``null``): margin null, verl's behaviour -- the paired baseline;
* ``legacy-first``, ``legacy-draw``, ``legacy-hashed``: margin null with that tie rule
  whatever the workload's (``legacy-draw`` on a ``first`` workload is PR #7613's random
  ties against Aug-2026 main's first-in-order ties, on the same trajectories);
* ``margin-N``: PR #7435, ``affinity_break_margin=N``;
* ``dual-ABS`` or ``dual-ABS-REL``: PR #6533's gate, ``DualThreshold(ABS, REL)``, REL
  defaulting to 3/2;
* ``least-loaded``: unkeyed requests, no stickiness;
* ``band-mM-TT-capC``: the context band (SPEC section 7.5), ``affinity_break_margin=M``,
  ``affinity_break_tokens=T``, ``affinity_break_band_cap=C``: a pin is kept while its load
  is at most ``min + min(M + c // T, C)`` for a turn of ``c`` prompt tokens;
* ``band-mM-TT-capC-reuse``: the same core configuration, but the simulated adapter sends
  ``c`` scaled by the pinned replica's observed reuse (``context_source = "reuse"``, see
  :func:`reuse_scaled_context`): the prompt tokens a break would throw away, as a router
  can estimate them from vLLM's per-response ``cached_tokens``;
* ``group-only``: PR #6122's group pins (SPEC section 7.6): ``group_stickiness="only"``
  with the legacy policy, so a prompt's samples share one replica that is never
  reconsidered;
* ``group-margin-N``: group pins with a band: ``group_stickiness="fallback"`` and
  ``affinity_break_margin=N``; a sample's own pin comes first, a new sample joins its
  group's pin while that is within ``min + N``, and both kinds of pin break as PR #7435's;
* ``prefix-pP-margin-N``: prefix-aware placement inside the band (SPEC section 8.1):
  ``placement_margin=P`` with ``affinity_break_margin=N``. A placement (a new, broken or
  unpinned conversation) may use any replica within ``min + P`` and takes the one holding
  the most of the turn's prompt; a kept pin is PR #7435's;
* ``prefix-pP-group-margin-N``: both: group pins inside margin N, and prefix-aware
  placement within ``min + P`` wherever a conversation or a group is placed;
* either with ``-index`` appended: the same core configuration, with the estimate from
  the adapters' own index instead (``prefix_source = "index"``, below).

With prefix-aware placement the simulated adapter sends ``cached_prefix`` from one of two
sources (SPEC R-PFX-7; without the option nothing is sent, the core would not read it,
R-PFX-1):

* ``"cache"``: for every replica, the prompt tokens its KV pool would serve from cache
  for this turn now (its ``KvPool.lookup``), what a router fed vLLM's KV-cache events
  knows. A prompt is in a pool only once a replica has admitted it, so samples of one
  prompt launched together see nothing of one another;
* ``"index"``: :class:`affinity_runtime.PrefixIndex`, the index the verl adapter and
  ``affinity serve`` ship, fed the turn's block chain (the prompt's blocks shared by its
  group, then the trajectory's own) and recording the chosen replica at once, as the
  adapters do. Its capacity is the replica's KV pool in blocks.

Every acquire carries its trajectory's group (``g<prompt index>``); a policy without group
stickiness never reads it (SPEC R-GRP-7), so its decisions are those without groups.

Users add a policy with a table naming any core ``Config`` fields, e.g.
``{name = "m3", affinity_break_margin = 3}``; the core validates it.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any

import attrs

from affinity_engine import (
    Acquired,
    Config,
    ConfigError,
    DualThreshold,
    Path,
    ReleaseResult,
    State,
)
from affinity_runtime import ReuseMeter, RoutingDriver

__all__ = [
    "BASELINE",
    "DEFAULT_POLICIES",
    "Balancer",
    "PolicyError",
    "PolicySpec",
    "ReuseMeter",
    "parse_policies",
    "parse_policy",
]

BASELINE = "legacy"
DEFAULT_POLICIES = (
    "legacy", "margin-0", "margin-1", "margin-2", "margin-4", "margin-8",
    "dual-4", "dual-8", "dual-64", "least-loaded",
)
_NAME_FORMS = ("legacy, null, legacy-first, legacy-draw, legacy-hashed, margin-N, dual-ABS, "
               "dual-ABS-REL, band-mM-TT-capC, "
               "band-mM-TT-capC-reuse, group-only, group-margin-N, prefix-pP-margin-N, "
               "prefix-pP-group-margin-N (either with -index), least-loaded, or a table")
CONTEXT_SOURCES = ("prompt", "reuse")
PREFIX_SOURCES = ("cache", "index")
_TABLE_KEYS = {"name", "affinity_break_margin", "balance_abs_threshold",
               "balance_rel_threshold", "tie_break", "sticky", "max_cache_size",
               "affinity_break_tokens", "affinity_break_band_cap", "context_source",
               "group_stickiness", "group_break_margin", "max_group_cache_size",
               "placement_margin", "prefix_source"}


class PolicyError(ValueError):
    """A policy name or table is not understood or not valid for the core."""


@attrs.frozen(kw_only=True)
class PolicySpec:
    """A routing policy: the core ``Config`` fields it sets and whether it is sticky."""

    name: str
    affinity_break_margin: int | None = None
    balance_abs_threshold: int | None = None
    balance_rel_threshold: Fraction = Fraction(3, 2)
    tie_break: str | None = None  # None: the workload's tie_break
    sticky: bool = True
    max_cache_size: int = 10000
    affinity_break_tokens: int | None = None  # the context band's T (SPEC section 7.5)
    affinity_break_band_cap: int | None = None  # the context band's cap
    # What the adapter sends as context_tokens: the prompt length, or the prompt length
    # scaled by the pinned replica's observed reuse. The core never sees the difference.
    context_source: str = "prompt"
    group_stickiness: str = "off"  # SPEC section 7.6
    group_break_margin: int | None = None
    max_group_cache_size: int = 10000
    placement_margin: int | None = None  # prefix-aware placement's m_place (SPEC 8.1)
    # Where the simulated adapter's cached_prefix comes from: the replicas' KV pools, or
    # the adapters' own index of routed blocks. The core never sees the difference.
    prefix_source: str = "cache"

    def config(self, default_tie_break: str = "draw") -> Config:
        gate = None
        if self.balance_abs_threshold is not None:
            gate = DualThreshold(self.balance_abs_threshold, self.balance_rel_threshold)
        return Config(
            affinity_break_margin=self.affinity_break_margin,
            dual_threshold=gate,
            max_cache_size=self.max_cache_size,
            tie_break=self.tie_break or default_tie_break,
            affinity_break_tokens=self.affinity_break_tokens,
            affinity_break_band_cap=self.affinity_break_band_cap,
            group_stickiness=self.group_stickiness,
            group_break_margin=self.group_break_margin,
            max_group_cache_size=self.max_group_cache_size,
            placement_margin=self.placement_margin,
        )

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "affinity_break_margin": self.affinity_break_margin,
            "balance_abs_threshold": self.balance_abs_threshold,
            "balance_rel_threshold": str(self.balance_rel_threshold)
            if self.balance_abs_threshold is not None else None,
            "tie_break": self.tie_break,
            "sticky": self.sticky,
            "affinity_break_tokens": self.affinity_break_tokens,
            "affinity_break_band_cap": self.affinity_break_band_cap,
            "context_source": self.context_source,
            # Group options appear only when set, so records of earlier policies compare.
            **({} if self.group_stickiness == "off" else {
                "group_stickiness": self.group_stickiness,
                "group_break_margin": self.group_break_margin,
                "max_group_cache_size": self.max_group_cache_size,
            }),
            **({} if self.placement_margin is None else {
                "placement_margin": self.placement_margin,
                "prefix_source": self.prefix_source,
            }),
        }


def _from_name(name: str) -> PolicySpec:
    if name in ("legacy", "null"):
        return PolicySpec(name=name)
    if name == "least-loaded":
        return PolicySpec(name=name, sticky=False)
    match = re.fullmatch(r"legacy-(first|draw|hashed)", name)
    if match:
        return PolicySpec(name=name, tie_break=match.group(1))
    match = re.fullmatch(r"margin-(\d+)", name)
    if match:
        return PolicySpec(name=name, affinity_break_margin=int(match.group(1)))
    match = re.fullmatch(r"dual-(\d+)(?:-(\d+(?:\.\d+)?))?", name)
    if match:
        rel = Fraction(match.group(2)) if match.group(2) else Fraction(3, 2)
        return PolicySpec(name=name, balance_abs_threshold=int(match.group(1)),
                          balance_rel_threshold=rel)
    match = re.fullmatch(r"band-m(\d+)-T(\d+)-cap(\d+)(-reuse)?", name)
    if match:
        margin, tokens, cap = (int(g) for g in match.groups()[:3])
        return PolicySpec(name=name, affinity_break_margin=margin,
                          affinity_break_tokens=tokens, affinity_break_band_cap=cap,
                          context_source="reuse" if match.group(4) else "prompt")
    if name == "group-only":
        return PolicySpec(name=name, group_stickiness="only")
    match = re.fullmatch(r"group-margin-(\d+)", name)
    if match:
        return PolicySpec(name=name, group_stickiness="fallback",
                          affinity_break_margin=int(match.group(1)))
    match = re.fullmatch(r"prefix-p(\d+)-(group-)?margin-(\d+)(-index)?", name)
    if match:
        return PolicySpec(name=name, placement_margin=int(match.group(1)),
                          group_stickiness="fallback" if match.group(2) else "off",
                          affinity_break_margin=int(match.group(3)),
                          prefix_source="index" if match.group(4) else "cache")
    raise PolicyError(f"unknown policy {name!r}; accepted: {_NAME_FORMS}")


def _from_table(table: Mapping[str, Any]) -> PolicySpec:
    unknown = set(table) - _TABLE_KEYS
    if unknown:
        raise PolicyError(
            f"policy table has unknown keys {sorted(unknown)}; accepted: {sorted(_TABLE_KEYS)}"
        )
    name = table.get("name")
    if not isinstance(name, str) or not name:
        raise PolicyError(f"a policy table needs a non-empty string 'name', got {name!r}")
    fields = {k: v for k, v in table.items() if k != "name"}
    if "balance_rel_threshold" in fields:
        rel = fields["balance_rel_threshold"]
        fields["balance_rel_threshold"] = Fraction(str(rel)) if isinstance(rel, float) else rel
    sticky = fields.get("sticky", True)
    if not isinstance(sticky, bool):
        raise PolicyError(f"policy {name!r}: sticky must be true or false, got {sticky!r}")
    return PolicySpec(name=name, **fields)


def parse_policy(spec: str | Mapping[str, Any] | PolicySpec) -> PolicySpec:
    """A name or a table -> a validated :class:`PolicySpec` (the core checks the config)."""
    if isinstance(spec, PolicySpec):
        policy = spec
    elif isinstance(spec, str):
        policy = _from_name(spec.strip())
    elif isinstance(spec, Mapping):
        policy = _from_table(spec)
    else:
        raise PolicyError(f"a policy is a name or a table, got {spec!r}; accepted: {_NAME_FORMS}")
    if policy.prefix_source not in PREFIX_SOURCES:
        raise PolicyError(f"policy {policy.name!r}: prefix_source must be one of "
                          f"{list(PREFIX_SOURCES)}, got {policy.prefix_source!r}")
    if policy.context_source not in CONTEXT_SOURCES:
        raise PolicyError(f"policy {policy.name!r}: context_source must be one of "
                          f"{list(CONTEXT_SOURCES)}, got {policy.context_source!r}")
    try:
        policy.config()
    except (ConfigError, TypeError) as exc:
        raise PolicyError(f"policy {policy.name!r}: {exc}") from None
    return policy


def parse_policies(specs: Iterable[str | Mapping[str, Any] | PolicySpec]) -> list[PolicySpec]:
    """Parse a policy list; the baseline ``legacy`` is added first if missing."""
    policies = [parse_policy(s) for s in specs]
    names = [p.name for p in policies]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise PolicyError(f"duplicate policy names: {duplicates}")
    if BASELINE not in names:
        policies.insert(0, parse_policy(BASELINE))
    return policies


class Balancer:
    """One balancer over ``servers``: the core driven by :class:`~affinity_runtime.RoutingDriver`,
    with the simulator's tallies (paths, acquires per server, ignored releases)."""

    def __init__(self, config: Config, servers: list[str], sticky: bool,
                 rng: random.Random) -> None:
        getrandbits = rng.getrandbits
        self.driver = RoutingDriver(config, servers, draw=lambda _ties: getrandbits(31))
        self.sticky = sticky
        self.rng = rng
        self.paths: dict[Path, int] = dict.fromkeys(Path, 0)
        self.served: dict[str, int] = dict.fromkeys(servers, 0)  # acquires per server
        self.ignored_releases = 0

    @property
    def config(self) -> Config:
        return self.driver.config

    @property
    def state(self) -> State:
        return self.driver.state

    @property
    def reads_prefix(self) -> bool:
        """Whether acquires read ``cached_prefix`` (prefix-aware placement is on)."""
        return self.driver.config.prefix_placement

    def acquire(self, request_id: str, context_tokens: int | None = None,
                group_id: str | None = None,
                cached_prefix: tuple[tuple[str, int], ...] = ()) -> str:
        """Route one turn; ``context_tokens`` is its prompt length (read by the band only),
        ``group_id`` its prompt's group (read by group stickiness only) and
        ``cached_prefix`` each replica's cached tokens of the prompt (read by prefix-aware
        placement only)."""
        outcome = self.driver.acquire(request_id if self.sticky else None, context_tokens,
                                      group_id=group_id, cached_prefix=cached_prefix)
        if not isinstance(outcome, Acquired):
            raise RuntimeError(f"the core rejected the acquire of {request_id!r}: {outcome!r}")
        self.paths[outcome.path] += 1
        self.served[outcome.server_id] += 1
        return outcome.server_id

    def release(self, server_id: str) -> None:
        if self.driver.release(server_id).result is not ReleaseResult.APPLIED:
            self.ignored_releases += 1

    def load(self, server_id: str) -> int:
        return self.driver.state.pool.load(server_id)
