"""Warm start of the verl balancer from its decision log (R-LOG-3).

An actor killed with SIGKILL while it held requests in flight, then re-created on the
same ``decision_log`` path, continues from the log's state: every sticky session keeps
its server, the dead actor's in-flight requests are released as abandoned (so no load is
stuck on a server), servers it was not given any more leave the pool, and
``affinity replay`` of the two runs exits 0.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from affinity_verl import AffinityLoadBalancer

from affinity_conformance.decision_log import read_log
from affinity_runtime.warm_start import ABANDONED

OPTIONS: dict[str, Any] = {"affinity_break_margin": 2, "lease_accounting": True, "seed": 3}
SESSIONS = [f"conv-{i}" for i in range(60)]

FIRST_RUN = textwrap.dedent("""
    import json, sys
    from affinity_verl import AffinityLoadBalancer
    lb = AffinityLoadBalancer(dict.fromkeys(["s0", "s1", "s2"]), decision_log=sys.argv[1],
                              **json.loads(sys.argv[2]))
    pins = {}
    for turn in range(3):
        for session in json.loads(sys.argv[3]):
            server, _ = lb.acquire_server(request_id=session)
            pins[session] = server
            if turn < 2 or session.endswith("7"):  # the last turns of most stay in flight
                lb.release_server(server_id=server, request_id=session)
    print(json.dumps(pins), flush=True)
    sys.stdin.read()  # alive, holding the log, until killed
""")


def test_a_killed_actor_restarted_on_its_log_keeps_its_sessions(tmp_path: Path) -> None:
    path = tmp_path / "lb.ndjson"
    first = subprocess.Popen([sys.executable, "-c", FIRST_RUN, str(path), json.dumps(OPTIONS),
                              json.dumps(SESSIONS)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout is not None
        pins = json.loads(first.stdout.readline())
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
    in_flight = sum(not s.endswith("7") for s in SESSIONS)

    # s2 is not given any more: it leaves the pool; the others keep their sessions.
    lb = AffinityLoadBalancer(dict.fromkeys(["s0", "s1"]), decision_log=str(path), **OPTIONS)
    status = lb.get_status()
    assert status["total_inflight"] == 0 and set(status["servers"]) == {"s0", "s1"}
    assert status["sticky_entries"] == len(SESSIONS)  # the pins came back
    for session in SESSIONS:
        server, _ = lb.acquire_server(request_id=session)
        if pins[session] != "s2":
            assert server == pins[session], session
        lb.release_server(server_id=server, request_id=session)
    files = lb.decision_log_files()
    lb._driver.close()  # (the actor's end, without Ray)

    assert len(files) == 2
    records = [r.data for r in read_log(files[-1]) if not r.is_header]
    abandoned = [r for r in records if r.get("reason") == ABANDONED]
    assert len(abandoned) == in_flight
    assert {r["outcome"]["result"] for r in abandoned} == {"applied"}
    assert any(r.get("reason") == "restart: no longer configured" for r in records)
    done = subprocess.run([sys.executable, "-m", "affinity_cli.main", "replay", *files],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 run(s)" in done.stdout and "warm restart" in done.stdout
