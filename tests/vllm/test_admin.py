"""The run-time pool API of ``affinity serve`` (admin.py): list, add, remove, drain.

Off by default; on its own port or a unix socket (mode 0600); a bearer token beyond
loopback (refused to start without one). Every change is an AddServers / RemoveServers
event in the decision log with the operator's reason, and the log replays clean. A
drained backend gets no new request while the ones running on it finish; health checks
never undo an admin removal.
"""

from __future__ import annotations

import asyncio
import socket
import stat
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from affinity_vllm.admin import MAX_SOCKET_PATH_BYTES, socket_path_problem
from affinity_vllm.options import OptionsError, RouterOptions
from affinity_vllm.stub import StubOptions, StubServer

from affinity_conformance.decision_log import read_log

from .fleet import Fleet, assert_replays, fleet, run, settle

TOKEN = "s3cret-token-0123456789"


async def _admin(f: Fleet, method: str, path: str, body: Any = None,
                 token: str | None = None) -> tuple[int, Any]:
    assert f.router.admin is not None and f.router.admin.port is not None
    headers = {} if token is None else {"authorization": f"Bearer {token}"}
    url = f"http://127.0.0.1:{f.router.admin.port}{path}"
    async with f.client.request(method, url, json=body, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


def _reasons(path: Path) -> list[tuple[str, str | None]]:
    return [(r.data["event"]["op"], r.data.get("reason")) for r in read_log(path)
            if not r.is_header and r.data["event"]["op"] in ("add_servers", "remove_servers")]


def test_off_by_default() -> None:
    async def scenario() -> None:
        async with fleet(1) as f:
            assert f.router.admin is None
    run(scenario())


def test_add_remove_drain_and_list_are_logged_with_their_reasons(tmp_path: Path) -> None:
    log = tmp_path / "log.ndjson"

    async def scenario() -> None:
        async with fleet(2, decision_log=str(log), admin_port=0,
                         stub={"token_delay": 0.05}) as f:
            s0, s1 = (s.url for s in f.stubs)
            status, listing = await _admin(f, "GET", "/backends")
            assert status == 200 and listing["urls"] == [s0, s1]
            assert {b["state"] for b in listing["backends"]} == {"active"}

            # drain s1 while a request runs on it: no new request goes there, the
            # running one finishes, and the answer says when it is drained.
            pins = {key: (await f.complete(key)).backend for key in map(str, range(8))}
            session = next(key for key, backend in pins.items() if backend == s1)
            running = asyncio.create_task(f.complete(session, max_tokens=20))
            await asyncio.sleep(0.2)
            status, drained = await _admin(f, "POST", "/backends/drain",
                                           {"url": s1, "reason": "kernel upgrade"})
            assert status == 200 and drained["state"] == "draining", drained
            assert drained["open_requests"] == 1
            moved = await f.complete(session)
            assert moved.backend == s0  # no new request on a draining backend
            assert (await running).status == 200  # the running one finished
            status, drained = await _admin(f, "POST", "/backends/drain",
                                           {"url": s1, "reason": "kernel upgrade",
                                            "wait": 5})
            assert drained["state"] == "drained" and drained["open_requests"] == 0
            f.router.probed(s1, True)  # a passing health check does not undo it
            assert not f.router.table.is_active(s1)

            # add a backend the router has never seen, then remove it again
            extra = StubServer(StubOptions(name="s2"))
            await extra.start()
            try:
                status, added = await _admin(f, "POST", "/backends/add",
                                             {"url": extra.url, "reason": "scale out"})
                assert status == 200 and added == {"url": extra.url, "changed": True,
                                                   "new": True, "state": "active"}
                status, _ = await _admin(f, "POST", "/backends/remove",
                                         {"url": s0, "reason": "bad GPU"})
                assert status == 200
                reply = await f.complete("anyone")
                assert reply.status == 200 and reply.backend == extra.url
                _, listing = await _admin(f, "GET", "/backends")
                states = {b["url"]: b["state"] for b in listing["backends"]}
                assert states == {s0: "removed", s1: "drained", extra.url: "active"}
                await _admin(f, "POST", "/backends/add", {"url": s1})  # back in
                await settle(f)
            finally:
                await extra.stop()
        assert _reasons(log) == [
            ("remove_servers", "admin drain: kernel upgrade"),
            ("add_servers", "admin add: scale out"),
            ("remove_servers", "admin remove: bad GPU"),
            ("add_servers", "admin add: no reason given"),
        ]
        assert_replays(log)
    run(scenario())


def test_bad_admin_requests_get_a_4xx_naming_the_problem() -> None:
    async def scenario() -> None:
        async with fleet(1, admin_port=0) as f:
            only = f.stubs[0].url
            cases: list[tuple[str, str, Any, int, str]] = [
                ("POST", "/backends/remove", {"url": only}, 409, "last backend"),
                ("POST", "/backends/remove", {"url": "http://127.0.0.1:1"}, 404,
                 "unknown backend"),
                ("POST", "/backends/add", {"url": "ftp://x"}, 400, "http"),
                ("POST", "/backends/add", {"url": only, "why": "x"}, 400, "unknown fields"),
                ("POST", "/backends/add", [1], 400, "JSON object"),
                ("POST", "/backends/drain", {"url": only, "wait": -1}, 400, "wait must be"),
                ("POST", "/backends/add", {"url": only, "reason": ""}, 400, "reason must be"),
                ("GET", "/backends/add", None, 405, "allowed: POST"),
                ("GET", "/nope", None, 404, "no admin route"),
            ]
            for method, path, body, want, words in cases:
                status, answer = await _admin(f, method, path, body)
                assert status == want, (path, body, answer)
                assert words in answer["error"]["message"], answer
            assert f.router.table.is_active(only)
    run(scenario())


def test_beyond_loopback_needs_a_token_and_the_token_is_checked() -> None:
    with pytest.raises(OptionsError, match="needs a bearer token"):
        RouterOptions(backends=("http://127.0.0.1:9",), admin_port=0, admin_host="0.0.0.0")
    with pytest.raises(OptionsError, match="at least 16"):
        RouterOptions(backends=("http://127.0.0.1:9",), admin_port=0, admin_token="short")
    RouterOptions(backends=("http://127.0.0.1:9",), admin_port=0, admin_host="0.0.0.0",
                  admin_token=TOKEN)

    async def scenario() -> None:
        async with fleet(1, admin_port=0, admin_token=TOKEN) as f:
            status, answer = await _admin(f, "GET", "/backends")
            assert status == 401 and "Bearer" in answer["error"]["message"]
            status, _ = await _admin(f, "GET", "/backends", token="wrong-token-0123456789")
            assert status == 401
            status, listing = await _admin(f, "GET", "/backends", token=TOKEN)
            assert status == 200 and listing["urls"] == [f.stubs[0].url]
            # the admin routes are not on the client port
            async with f.client.get(f.url + "/backends") as resp:
                assert resp.status == 404
    run(scenario())


def test_a_token_file_is_read_and_a_missing_one_is_a_clear_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from affinity_cli.main import main

    missing = tmp_path / "nope"
    code = main(["serve", "--backend", "http://127.0.0.1:9", "--admin-port", "0",
                 "--admin-token-file", str(missing)])
    assert code == 2
    assert f"cannot read --admin-token-file {str(missing)!r}" in capsys.readouterr().err
    short = tmp_path / "short"
    short.write_text("tiny\n")
    code = main(["serve", "--backend", "http://127.0.0.1:9", "--admin-port", "0",
                 "--admin-host", "0.0.0.0", "--admin-token-file", str(short)])
    assert code == 2
    assert "admin_token must be at least 16" in capsys.readouterr().err


# ------------------------------------------------------------------- unix socket
async def _over_socket(path: Path, method: str, route: str, body: Any = None
                       ) -> tuple[int, Any]:
    connector = aiohttp.UnixConnector(path=str(path))
    async with aiohttp.ClientSession(connector=connector) as client, client.request(
            method, f"http://admin{route}", json=body) as resp:
        return resp.status, await resp.json(content_type=None)


def test_the_unix_socket_serves_the_api_to_this_user_only(tmp_path: Path) -> None:
    sock, log = tmp_path / "admin.sock", tmp_path / "log.ndjson"

    async def scenario() -> None:
        async with fleet(2, decision_log=str(log), admin_socket=str(sock)) as f:
            assert f.router.admin is not None and f.router.admin.port is None  # no TCP
            assert stat.S_ISSOCK(sock.stat().st_mode)
            assert stat.S_IMODE(sock.stat().st_mode) == 0o600  # this user only
            status, listing = await _over_socket(sock, "GET", "/backends")
            assert status == 200 and len(listing["urls"]) == 2
            s0 = listing["urls"][0]
            status, _ = await _over_socket(sock, "POST", "/backends/remove",
                                           {"url": s0, "reason": "over the socket"})
            assert status == 200 and s0 not in f.router.table.active
            status, body = await _over_socket(sock, "POST", "/backends/remove", {"url": 5})
            assert status == 400 and "url" in body["error"]["message"]
        assert not sock.exists()  # the router removes its own socket when it stops
    run(scenario())
    assert ("remove_servers", "admin remove: over the socket") in _reasons(log)
    assert_replays(log)


def test_a_taken_socket_path_is_refused_and_left_alone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from affinity_cli.main import main

    assert socket_path_problem(str(tmp_path / "free.sock")) is None
    regular = tmp_path / "notes.txt"
    regular.write_text("keep me\n")
    problem = socket_path_problem(str(regular))
    assert problem is not None and "not a socket" in problem
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(str(tmp_path / "live.sock"))
    live.listen()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(tmp_path / "stale.sock"))
    stale.close()  # a killed router leaves its socket file behind
    try:
        problem = socket_path_problem(str(tmp_path / "live.sock"))
        assert problem is not None and "another process answers" in problem
        assert socket_path_problem(str(tmp_path / "stale.sock")) is None
    finally:
        live.close()
    problem = socket_path_problem(str(tmp_path / "no-dir" / "a.sock"))
    assert problem is not None and "does not exist" in problem
    long = "/tmp/" + "x" * MAX_SOCKET_PATH_BYTES
    problem = socket_path_problem(long)
    assert problem is not None and f"1 to {MAX_SOCKET_PATH_BYTES} bytes, got {len(long)}" in (
        problem)
    # On the command line: exit 2 before anything starts, and the file is untouched.
    code = main(["serve", "--backend", "http://127.0.0.1:9", "--admin-socket", str(regular)])
    assert code == 2 and "not a socket" in capsys.readouterr().err
    assert regular.read_text() == "keep me\n"
    with pytest.raises(OptionsError, match="admin_socket must be a file path"):
        RouterOptions(backends=("http://127.0.0.1:9",), admin_socket=" ")

    async def replaces_the_stale_one() -> None:
        async with fleet(1, admin_socket=str(tmp_path / "stale.sock")):
            status, _ = await _over_socket(tmp_path / "stale.sock", "GET", "/backends")
            assert status == 200
    run(replaces_the_stale_one())


def test_stopping_removes_only_its_own_socket(tmp_path: Path) -> None:
    """A file put at the socket's path while the router runs is not the router's: the
    stop leaves it. (The control: without that, the router removes its own socket, as
    the test above checks.)"""
    sock = tmp_path / "admin.sock"

    async def scenario() -> None:
        async with fleet(1, admin_socket=str(sock)):
            sock.unlink()
            other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            other.bind(str(sock))  # another program's socket now, at the same path
            other.close()
        assert sock.exists()
    run(scenario())
