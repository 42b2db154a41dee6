"""Check NDJSON decision logs (written by ``affinity_runtime.decision_log``) against the spec.

Theory of operation
-------------------
Every log file is self-contained: its header holds the configuration and the full state
before the file's first record, so each file of a rotated set is replayed on its own.
For each record the reference core applies the logged event to the current state and
three things must hold:

1. ``seq`` is the previous record's plus one (the header's ``seq`` for the first) -- a
   gap means a deleted record, a step back a reordered one;
2. the logged ``outcome`` equals the core's exactly (canonical JSON);
3. ``summary`` equals the core's next state's summary (``state_summary``), and where
   the record carries one, ``state_digest`` equals the digest of the core's next state;
   the file's first record and at least every 1,024th must carry one (a log written
   without digests would be checked only on outcomes and summaries: a malformed log).

Files given together (a rotated set, oldest first) must also join up (R-LOG-1): each
header's ``seq`` is one past the previous file's last record, its configuration is the
previous file's, and its state has the digest of the state the previous file ended in --
so rotation lost, reordered or rewrote nothing between the files.

A header with ``"restart"`` starts a new *run* (R-LOG-3): a writer restarted on the same
path. A ``warm`` restart continued the old run's state, so its header must join the file
before it exactly as a rotation does -- also when that file ends in a cut line, which is
what a crash leaves -- and that check is the proof that the restarted writer's state is
the replayed state. A ``cold`` restart starts from a fresh state and is replayed alone.
A file after a truncated one without a restart header is replayed alone too. The set's
result counts its runs.

The logged event already carries everything the core needs: the adapter writes the
``tie_draw`` it drew and the ``request_hash`` it computed. The first violation ends the
file's replay (everything after it is built on a state the spec never reached) and is
reported with the two records before it. Malformed input -- not JSON, a missing field,
an undecodable config, state or event -- is a :class:`LogError` naming file and line;
a last line without its newline is reported as a truncated log, the signature of a
writer that died mid-record.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs

from affinity_engine import (
    Acquire,
    CodecError,
    Config,
    ConfigError,
    Event,
    Outcome,
    State,
    allowed,
    canonical_dumps,
    config_from_json,
    config_to_json,
    event_from_json,
    outcome_to_json,
    state_digest,
    state_from_json,
    step,
)
from affinity_runtime.decision_log import DEFAULT_DIGEST_EVERY, state_summary

from .decision_log import LogError, LogRecord, read_log
from .diagnosis import describe_event, explain_acquire, note_repin

DIGEST_EVERY = DEFAULT_DIGEST_EVERY
"""R-LOG-1: a state digest on each file's first record and at least every 1,024 records."""

__all__ = ["DIGEST_EVERY", "RESTART_MODES", "FileResult", "LogDivergence", "LogError",
           "Observer", "count_runs", "replay_file", "replay_files"]

Observer = Callable[[Event, Outcome, State], None]
"""Called as ``observer(event, outcome, state_after)`` for every record that matched."""


@attrs.frozen
class LogDivergence:
    path: str
    line: int
    seq: Any
    event: str
    problem: str
    logged: str
    expected: str
    context: tuple[str, ...]
    requirements: tuple[str, ...]

    def render(self) -> str:
        lines = [f"{self.path}:{self.line} (seq {self.seq}): {self.event}: {self.problem}"]
        for item in self.context:
            lines.append(f"  before: {item}")
        lines.append(f"  logged:   {self.logged}")
        lines.append(f"  expected: {self.expected}")
        if self.requirements:
            lines.append(f"  requirements: {', '.join(self.requirements)}")
        return "\n".join(lines)


@attrs.frozen
class FileResult:
    path: str
    records: int  # records that matched the spec
    first_seq: int | None
    last_seq: int | None
    divergence: LogDivergence | None = None
    truncated: str | None = None  # the reader's message when the last line is cut off
    config: Config | None = None  # from the header (None only if the file had none)
    header_seq: int | None = None
    final_state: State | None = None  # after the last matching record (or the header's)
    restart: str | None = None  # the header's restart mode: this file starts a new run
    new_run: bool = False  # replayed without joining the file before it (or a warm restart)

    @property
    def next_seq(self) -> int | None:
        """The ``seq`` the file after this one must start at."""
        if self.last_seq is not None:
            return self.last_seq + 1
        return self.header_seq


RESTART_MODES = ("warm", "cold")


def _restart_mode(path: str, data: dict[str, Any]) -> str | None:
    restart = data.get("restart")
    if restart is None:
        return None
    mode = restart.get("mode") if isinstance(restart, dict) else None
    if mode not in RESTART_MODES:
        raise LogError(f"{path}:1: header restart must be an object with mode "
                       f"{' or '.join(map(repr, RESTART_MODES))}, got {restart!r}")
    return str(mode)


def _header(path: str, data: dict[str, Any]) -> tuple[Config, State, int]:
    try:
        config = config_from_json(data.get("config"))
    except (CodecError, TypeError) as exc:  # TypeError: e.g. a list where a name belongs
        raise LogError(f"{path}:1: header config: {exc}") from None
    try:
        state = state_from_json(config, data.get("state"))
    except (CodecError, ConfigError, TypeError) as exc:
        raise LogError(f"{path}:1: header state: {exc}") from None
    seq = data.get("seq")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        raise LogError(f"{path}:1: header seq must be an integer >= 0, got {seq!r}")
    return config, state, seq


def _join_problem(previous: FileResult, config: Config, state: State, seq: int
                  ) -> tuple[str, str, str] | None:
    """(problem, logged, expected) when a header does not continue ``previous``
    (R-LOG-1), else None."""
    assert previous.config is not None and previous.final_state is not None
    if previous.next_seq != seq:
        why = ("a new run starts here (a restarted writer); check runs apart with "
               "--separate" if seq == 0 else "records lost, or files out of order?")
        return (f"the header does not continue {previous.path}, which ends before seq "
                f"{previous.next_seq} ({why})",
                f"header seq {seq}", f"header seq {previous.next_seq}")
    if previous.config != config:
        return (f"the header's config differs from {previous.path}'s",
                _text(config_to_json(config)), _text(config_to_json(previous.config)))
    got, want = state_digest(state), state_digest(previous.final_state)
    if got != want:
        return (f"the header's state is not the state {previous.path} ended in",
                f"header state_digest {got}", f"state_digest {want}")
    return None


def replay_file(path: str | os.PathLike[str], observer: Observer | None = None, *,
                after: FileResult | None = None) -> FileResult:
    """Replay one log file; raises :class:`LogError` for malformed input.

    ``after``: the result of the file this one follows in a rotated set; the header must
    continue it (R-LOG-1), or the file is reported as diverging at line 1.
    """
    name = os.fspath(path)
    config: Config | None = None
    state: State | None = None
    header_seq: int | None = None
    expected_seq = 0
    first: int | None = None
    last: int | None = None
    checked = 0
    context: list[str] = []
    since_digest = 0  # records since the last one with a state_digest, this one excluded
    repinned: dict[str, tuple[str, str]] = {}  # id -> (seq of its last break, pin before)
    restart: str | None = None
    new_run = False
    records = read_log(name)

    def stopped(divergence: LogDivergence) -> FileResult:
        return FileResult(name, checked, first, last, divergence, config=config,
                          header_seq=header_seq, final_state=state, restart=restart,
                          new_run=new_run)

    while True:
        try:
            record = next(records)
        except StopIteration:
            break
        except LogError as exc:
            if "truncated" in str(exc) and config is not None:
                return FileResult(name, checked, first, last, truncated=str(exc),
                                  config=config, header_seq=header_seq, final_state=state,
                                  restart=restart, new_run=new_run)
            raise
        except IsADirectoryError:
            raise LogError(f"{name}: is a directory, expected a log file") from None
        except OSError as exc:
            raise LogError(f"{name}: cannot read: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise LogError(f"{name}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        if record.is_header:
            config, state, expected_seq = _header(name, record.data)
            header_seq = expected_seq
            restart = _restart_mode(name, record.data)
            new_run = after is not None and (restart is not None
                                             or after.truncated is not None)
            # A cold restart, or a file after a cut one, starts over: nothing to join.
            joins = after is not None and (restart == "warm" or not new_run)
            join = _join_problem(after, config, state, expected_seq) if (
                joins and after is not None) else None
            if join is not None:
                problem, logged, expected = join
                reqs: tuple[str, ...] = ("R-LOG-1",)
                if restart == "warm":
                    problem = ("a warm restart does not continue the run before it: "
                               + problem)
                    reqs = ("R-LOG-3",)
                return stopped(LogDivergence(name, record.line, expected_seq, "header",
                                             problem, logged, expected, (), reqs))
            continue
        assert config is not None and state is not None
        data = record.data
        seq = data["seq"]
        op = data["event"].get("op") if isinstance(data["event"], dict) else None
        if op is not None and not isinstance(op, str):
            raise LogError(f"{name}:{record.line}: event op must be an event name, got "
                           f"{type(op).__name__}")
        try:
            event = event_from_json(data["event"])
        except (CodecError, TypeError) as exc:  # TypeError: an unhashable value looked up
            raise LogError(f"{name}:{record.line}: event: {exc}") from None
        words = describe_event(event)
        if isinstance(seq, bool) or seq != expected_seq:  # true == 1 in Python, not in JSON
            later = _line_of_seq(records, expected_seq)
            if later is not None:
                why = f"records are out of order (seq {expected_seq} is at line {later})"
            elif isinstance(seq, int) and seq > expected_seq:
                why = f"record seq {expected_seq} is missing (deleted line?)"
            else:
                why = "records are out of order or repeated"
            problem = f"seq {seq!r} where {expected_seq} was due: {why}"
            return stopped(LogDivergence(
                name, record.line, seq, words, problem, f"seq {seq!r}",
                f"seq {expected_seq}", tuple(context[-2:]), ()))
        t = step(config, state, event)
        want = outcome_to_json(t.outcome)
        if data["outcome"] != want:
            problem, why_reqs = _explain_outcome(config, state, event, data["outcome"], want,
                                             repinned)
            return stopped(LogDivergence(
                name, record.line, seq, words, problem, _text(data["outcome"]), _text(want),
                tuple(context[-2:]), tuple(why_reqs)))
        summary = state_summary(t.state)
        if data["summary"] != summary:
            return stopped(LogDivergence(
                name, record.line, seq, words,
                "the outcome matches but the state after it does not (summary differs)",
                _text(data["summary"]), _text(summary), tuple(context[-2:]), ("R-PURE-1",)))
        if "state_digest" not in data and (checked == 0 or since_digest >= DIGEST_EVERY):
            where = ("the first record of a file" if checked == 0 else
                     f"a record {since_digest} records after the last state_digest")
            raise LogError(f"{name}:{record.line}: record seq {seq} has no state_digest; "
                           f"{where} must carry one (R-LOG-1: the file's first record and "
                           f"at least every {DIGEST_EVERY}), or the replay sees only the "
                           "summary of the state")
        since_digest = 1 if "state_digest" in data else since_digest + 1
        if "state_digest" in data:
            digest = state_digest(t.state)
            if data["state_digest"] != digest:
                return stopped(LogDivergence(
                    name, record.line, seq, words,
                    "the outcome matches but the state after it does not "
                    "(state_digest differs)",
                    str(data["state_digest"]), digest, tuple(context[-2:]), ("R-PURE-1",)))
        state = t.state
        note_repin(repinned, event, t.outcome, f"seq {seq}")
        if observer is not None:
            observer(event, t.outcome, state)
        checked += 1
        first = seq if first is None else first
        last = seq
        expected_seq = seq + 1
        context.append(f"seq {seq} {words} -> {_short(want)}")
    return FileResult(name, checked, first, last, config=config, header_seq=header_seq,
                      final_state=state, restart=restart, new_run=new_run)


def _line_of_seq(records: Iterator[LogRecord], seq: int) -> int | None:
    """The line of a later record with ``seq`` (consumes the iterator; errors ignored)."""
    try:
        for record in records:
            if record.data.get("seq") == seq:
                return record.line
    except (LogError, OSError, UnicodeDecodeError):
        pass
    return None


def _text(value: Any) -> str:
    try:
        return canonical_dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _short(outcome: dict[str, Any]) -> str:
    kind = outcome.get("kind")
    if kind == "acquired":
        return f"acquired {outcome.get('server_id')} ({outcome.get('path')})"
    if kind == "released":
        return f"released {outcome.get('server_id')} ({outcome.get('result')})"
    if kind == "rejected":
        return f"rejected ({outcome.get('reason')})"
    return str(kind)


# A log cannot be re-run with other ties: a router's own draw must be in the log.
_TIE_HINT = ("a router that breaks ties its own way logs tie_break 'draw' in the header "
             "and, on each acquire, the index of its choice in the tie set as the event's "
             "tie_draw")


def _explain_outcome(config: Config, state: State, event: Event, logged: Any,
                     want: dict[str, Any],
                     repinned: dict[str, tuple[str, str]] | None = None
                     ) -> tuple[str, list[str]]:
    if (isinstance(event, Acquire) and isinstance(logged, dict)
            and logged.get("kind") == "acquired" and want.get("kind") == "acquired"):
        permitted_set = allowed(config, state, event)
        permitted = [s for s, _ in state.pool.items() if s in permitted_set]
        words, reqs = explain_acquire(config, state, event, logged.get("server_id"),
                                      permitted, want["server_id"], {}, repinned,
                                      tie_hint=_TIE_HINT)
        if logged.get("server_id") == want["server_id"]:
            differing = sorted(k for k in {*want, *logged} if logged.get(k) != want.get(k))
            words = f"the logged outcome differs in {differing}"
            reqs = ["R-OUT-3"]
        return words.replace("IMPL", "the log"), reqs
    return "the logged outcome is not the spec's", ["R-OUT-1"]


def replay_files(paths: Sequence[str | os.PathLike[str]],
                 observer: Observer | None = None, *, join: bool = True) -> list[FileResult]:
    """Replay a rotated set given oldest first: each file from its own header, each
    header checked to continue the file before it (R-LOG-1). Stops at the first
    divergence. A restart header starts a new run (R-LOG-3): a warm one must still
    continue the file before it, a cold one is replayed alone; so is a file after a
    truncated one without a restart header. ``join=False`` replays unrelated files, each
    alone, and every one of them: a divergence in one does not stop the others."""
    results: list[FileResult] = []
    for path in paths:
        previous = results[-1] if join and results else None
        result = replay_file(path, observer, after=previous)
        results.append(result)
        if result.divergence is not None and join:
            break
    return results


def count_runs(results: Sequence[FileResult]) -> int:
    """How many runs a replayed set holds: its first file's, plus one per file that
    started a new one (a restart, or a file after a truncated one)."""
    return (1 if results else 0) + sum(r.new_run for r in results[1:])
