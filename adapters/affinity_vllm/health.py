"""Backend health: passive outlier detection plus active checks, as a table.

Theory of operation
-------------------
Each configured backend is in one :class:`Health` state. Observations -- the outcome of
a proxied request, the result of an active ``GET /health`` -- become one
:class:`Signal` after the guards below, and :data:`TRANSITIONS` (data, like the core's
transition table) says the next state and the pool change. A pool change is applied
by the caller as the spec's ``RemoveServers`` / ``AddServers`` event through the routing
table, so it is in the decision log and replays like any other event.

Guards (what turns an observation into a signal):

* a response below 500 is ``SUCCESS`` and resets the failure run;
* a 5xx response, or a connect error (refused, connect timeout) is a ``FAILURE``; the
  run of consecutive failures becomes ``EJECT`` when it reaches ``eject_5xx`` (5xx) or
  ``eject_connect_errors`` (connect errors; ``eject_5xx=0`` never ejects for 5xx) -- as
  Envoy's ``consecutive_5xx`` and
  ``consecutive_local_origin_failure``. A 5xx run never ejects the last routable backend
  (Envoy's panic threshold: a request that makes every backend fail is not a backend
  fault); a refused connection does, since nothing is listening;
* a read timeout is *not* a failure: a slow request is not a dead backend
  (``backend_errors_total{kind="timeout"}`` counts it; the active check decides);
* active checks count in runs, as vllm-router's: ``failure_threshold`` consecutive
  failed checks make ``PROBE_FAIL`` (default 3: one stalled round is not a dead
  backend), and ``success_threshold`` consecutive passed checks make ``RETURN`` if the
  backend's back-off has elapsed and ``PROBE_PASS`` otherwise (default 2). Checks
  alone never remove the last routable backend: when every backend fails its checks at
  once (a shared stall) the pool keeps one, and requests -- whose connect errors still
  eject -- decide; ``/health`` reports the failing checks all the same.

The back-off of the n-th ejection in a row is ``ejection_base * 2**(n-1)``, at most
``ejection_max``; n goes back to 0 after a backend has stayed up for ``ejection_max``.

Requests that were in flight when a backend left the pool keep their leases; their
releases are matched to the lease's epoch by the core (lease accounting), so a backend
that returns starts from its own fresh count (``tests/vllm/test_health.py``).
"""

from __future__ import annotations

import enum

import attrs

__all__ = ["TRANSITIONS", "BackendHealth", "Health", "HealthPolicy", "PoolChange", "Signal"]


class Health(enum.Enum):
    UP = "up"  # in the routing pool
    EJECTED = "ejected"  # out for a back-off after consecutive failures
    DOWN = "down"  # out because the active check failed


class Signal(enum.Enum):
    SUCCESS = "success"
    FAILURE = "failure"
    EJECT = "eject"
    PROBE_PASS = "probe_pass"
    PROBE_FAIL = "probe_fail"
    RETURN = "return"


class PoolChange(enum.Enum):
    NONE = "none"
    REMOVE = "remove"  # RemoveServers
    ADD = "add"  # AddServers


# (state, signal) -> (next state, pool change). Missing pairs leave the state unchanged.
TRANSITIONS: dict[tuple[Health, Signal], tuple[Health, PoolChange]] = {
    (Health.UP, Signal.SUCCESS): (Health.UP, PoolChange.NONE),
    (Health.UP, Signal.FAILURE): (Health.UP, PoolChange.NONE),
    (Health.UP, Signal.EJECT): (Health.EJECTED, PoolChange.REMOVE),
    (Health.UP, Signal.PROBE_PASS): (Health.UP, PoolChange.NONE),
    (Health.UP, Signal.RETURN): (Health.UP, PoolChange.NONE),
    (Health.UP, Signal.PROBE_FAIL): (Health.DOWN, PoolChange.REMOVE),
    # late answers of requests that were in flight at ejection change nothing
    (Health.EJECTED, Signal.SUCCESS): (Health.EJECTED, PoolChange.NONE),
    (Health.EJECTED, Signal.FAILURE): (Health.EJECTED, PoolChange.NONE),
    (Health.EJECTED, Signal.EJECT): (Health.EJECTED, PoolChange.NONE),
    (Health.EJECTED, Signal.PROBE_PASS): (Health.EJECTED, PoolChange.NONE),
    (Health.EJECTED, Signal.PROBE_FAIL): (Health.EJECTED, PoolChange.NONE),
    (Health.EJECTED, Signal.RETURN): (Health.UP, PoolChange.ADD),
    (Health.DOWN, Signal.SUCCESS): (Health.DOWN, PoolChange.NONE),
    (Health.DOWN, Signal.FAILURE): (Health.DOWN, PoolChange.NONE),
    (Health.DOWN, Signal.EJECT): (Health.DOWN, PoolChange.NONE),
    (Health.DOWN, Signal.PROBE_FAIL): (Health.DOWN, PoolChange.NONE),
    (Health.DOWN, Signal.PROBE_PASS): (Health.UP, PoolChange.ADD),
    (Health.DOWN, Signal.RETURN): (Health.UP, PoolChange.ADD),
}


@attrs.frozen
class HealthPolicy:
    eject_5xx: int = 5
    eject_connect_errors: int = 1
    ejection_base: float = 5.0
    ejection_max: float = 300.0
    failure_threshold: int = 3  # consecutive failed health checks to remove
    success_threshold: int = 2  # consecutive passed health checks to re-add


@attrs.define
class BackendHealth:
    """One backend's health state; ``now`` comes from the caller (a monotonic clock)."""

    policy: HealthPolicy
    state: Health = Health.UP
    failures_5xx: int = 0
    failures_connect: int = 0
    ejections: int = 0  # ejections in a row (the back-off exponent)
    out_until: float = 0.0  # end of the current back-off
    up_since: float = 0.0
    probe_failures: int = 0  # the current run of failed health checks
    probe_passes: int = 0  # the current run of passed health checks
    ever_passed: bool = False  # a health check has passed since the router started

    def backoff(self) -> float:
        return float(min(self.policy.ejection_max,
                         self.policy.ejection_base * 2 ** max(0, self.ejections - 1)))

    def apply(self, signal: Signal, now: float) -> PoolChange:
        next_state, change = TRANSITIONS[(self.state, signal)]
        if signal is Signal.EJECT and change is PoolChange.REMOVE:
            if now - self.up_since >= self.policy.ejection_max:
                self.ejections = 0
            self.ejections += 1
            self.out_until = now + self.backoff()
        if change is PoolChange.ADD:
            self.up_since = now
        if change is not PoolChange.NONE or signal is Signal.SUCCESS:
            self.failures_5xx = self.failures_connect = 0
        if change is PoolChange.ADD:
            self.probe_passes = 0
        self.state = next_state
        return change

    # ------------------------------------------------------------- guards
    def response(self, status: int, now: float, others_routable: bool) -> PoolChange:
        if status < 500:
            return self.apply(Signal.SUCCESS, now)
        self.failures_5xx += 1
        if 0 < self.policy.eject_5xx <= self.failures_5xx and others_routable:
            return self.apply(Signal.EJECT, now)
        return self.apply(Signal.FAILURE, now)

    def connect_error(self, now: float) -> PoolChange:
        self.failures_connect += 1
        if self.failures_connect >= self.policy.eject_connect_errors:
            return self.apply(Signal.EJECT, now)
        return self.apply(Signal.FAILURE, now)

    def failing(self) -> bool:
        """Its health checks have failed ``failure_threshold`` times in a row."""
        return self.probe_failures >= self.policy.failure_threshold

    def healthy(self) -> bool:
        """It counts toward the router's ``/health``: a check has passed, and the checks
        have not failed ``failure_threshold`` times in a row since. Before its first
        pass a backend is unproven, not healthy: a router started beside backends that
        are still starting must not say ok while every one of them refuses."""
        return self.ever_passed and not self.failing()

    def probe(self, passed: bool, now: float, others_routable: bool = True) -> PoolChange:
        if not passed:
            self.probe_passes = 0
            self.probe_failures += 1
            if not self.failing() or not others_routable:
                return PoolChange.NONE
            return self.apply(Signal.PROBE_FAIL, now)
        self.probe_failures = 0
        self.probe_passes += 1
        self.ever_passed = True
        if self.state is not Health.UP and self.probe_passes < self.policy.success_threshold:
            return PoolChange.NONE
        return self.apply(Signal.RETURN if now >= self.out_until else Signal.PROBE_PASS, now)
