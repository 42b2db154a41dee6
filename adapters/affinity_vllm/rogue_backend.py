"""A misbehaving HTTP/1.1 backend, for tests of what a router does with bad answers
(``python -m affinity_vllm.rogue_backend --port N``).

Theory of operation
-------------------
A raw asyncio server -- no HTTP framework, so it can send what a framework would not.
It answers every GET (``/health`` and the other probes routers send) with 200 ``{}``
and every POST according to its ``x-rogue`` header or body field ``rogue`` (or, without
either, a mode drawn from :data:`FUZZ_MODES` by a seeded RNG), with a JSON body ``{"id":
<x-request-tag header or body field tag>}``: whoever receives that body can tell whose
answer it is. Modes:

* ``ok`` -- the answer; ``interim`` -- one to three 1xx (100, 102, 103) first;
* ``stray_after`` -- the answer, and a copy of it right behind it in the same write
  (a second response nobody asked for);
* ``stray_idle`` -- the answer, then ``stray_delay`` seconds later, on the idle
  connection, a whole extra response with id ``STRAY`` (``garbage`` instead: bytes
  that are not HTTP);
* ``reset`` -- the connection is reset before any answer; ``truncate`` -- the head
  promises more body than is sent, then the connection closes;
* ``big_headers`` -- 100 KiB of header fields; ``slow`` -- the answer after a pause.

Every request's target and headers are recorded in :attr:`RogueBackend.requests`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import struct

__all__ = ["FUZZ_MODES", "MODES", "RogueBackend", "main"]

MODES = ("ok", "interim", "stray_after", "stray_idle", "garbage", "reset", "truncate",
         "big_headers", "slow")
# What the fuzz draws from: never a stray that a proxy could not tell apart from the next
# answer (a whole response arriving after the router sent its next request is, on the
# wire, that request's answer): idle strays in the fuzz are garbage, not HTTP.
FUZZ_MODES = ("ok", "interim", "stray_after", "garbage", "reset", "truncate", "slow")


def _response(tag: bytes, status: int = 200, extra: bytes = b"") -> bytes:
    body = json.dumps({"id": tag.decode("latin-1")}).encode()
    return (b"HTTP/1.1 %d OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            % (status, len(body)) + extra + b"\r\n" + body)


class RogueBackend:
    def __init__(self, seed: int = 0, stray_delay: float = 0.05) -> None:
        self.rng = random.Random(seed)
        self.stray_delay = stray_delay
        self.requests: list[tuple[bytes, dict[bytes, bytes]]] = []
        self.modes: dict[str, int] = {}
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, port: int = 0) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                     ) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head[:-4].split(b"\r\n")
                target = lines[0].split(b" ")[1] if b" " in lines[0] else b""
                headers: dict[bytes, bytes] = {}
                for line in lines[1:]:
                    name, _, value = line.partition(b":")
                    headers[name.strip().lower()] = value.strip()
                length = int(headers.get(b"content-length", b"0"))
                body = await reader.readexactly(length) if length else b""
                if lines[0].startswith(b"GET "):
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                 b"content-length: 2\r\n\r\n{}")
                    continue
                _from_body(body, headers)
                self.requests.append((target, headers))
                if not await self._answer(headers, writer):
                    return
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def _answer(self, headers: dict[bytes, bytes], writer: asyncio.StreamWriter
                      ) -> bool:
        """Answer one request; False: the connection is finished."""
        tag = headers.get(b"x-request-tag", b"")
        mode = headers.get(b"x-rogue", b"").decode() or self.rng.choice(FUZZ_MODES)
        self.modes[mode] = self.modes.get(mode, 0) + 1
        answer = _response(tag)
        if mode == "interim":
            for _ in range(self.rng.randint(1, 3)):
                status = self.rng.choice((100, 102, 103))
                writer.write(b"HTTP/1.1 %d Interim\r\n" % status
                             + (b"link: </style.css>; rel=preload\r\n" if status == 103 else b"")
                             + b"\r\n")
            writer.write(answer)
        elif mode == "stray_after":
            writer.write(answer + answer)
        elif mode in ("stray_idle", "garbage"):
            writer.write(answer)
            await writer.drain()
            await asyncio.sleep(self.stray_delay)
            writer.write(_response(b"STRAY") if mode == "stray_idle" else b"\x00\x01junk\r\n")
        elif mode == "reset":
            sock = writer.get_extra_info("socket")
            if sock is not None:  # RST, not FIN
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return False
        elif mode == "truncate":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n{\"id\": ")
            await writer.drain()
            return False
        elif mode == "big_headers":
            filler = b"".join(b"x-filler-%d: %s\r\n" % (i, b"y" * 1000) for i in range(100))
            writer.write(_response(tag, extra=filler))
        elif mode == "slow":
            await asyncio.sleep(self.rng.uniform(0.0, 0.05))
            writer.write(answer)
        else:
            writer.write(answer)
        return True


def _from_body(body: bytes, headers: dict[bytes, bytes]) -> None:
    """Body fields ``tag`` / ``rogue`` stand in for the headers (a router may drop
    unknown headers but forwards the body)."""
    try:
        fields = json.loads(body)
    except ValueError:
        return
    if isinstance(fields, dict):
        for field, header in (("tag", b"x-request-tag"), ("rogue", b"x-rogue")):
            if isinstance(fields.get(field), str) and header not in headers:
                headers[header] = fields[field].encode()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    async def run() -> None:
        backend = RogueBackend(seed=args.seed)
        await backend.start(args.port)
        print(f"rogue backend on {backend.url}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(run())


if __name__ == "__main__":
    main()
