"""``python -m affinity_vllm.stub``: the stub vLLM server's command line.

Kept apart from :mod:`affinity_vllm.stub` so the server module stays about the server;
``affinity_vllm.stub.main`` still runs this.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Sequence

from .stub import FAULT_MODES, StubOptions, StubServer

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m affinity_vllm.stub",
        description="A fake vLLM server (no model, no GPU) for trying `affinity serve` and "
                    "for tests: OpenAI completions and chat (streaming too), /v1/models, "
                    "/health, /metrics with vLLM's names, /tokenize. Prints 'ready PORT' "
                    "once it listens.",
        epilog="example: python -m affinity_vllm.stub --port 8001 --name s1 &")
    parser.add_argument("--host", default="127.0.0.1", help="address (default: %(default)s)")
    parser.add_argument("--port", type=int, default=0,
                        help="port; 0 picks a free one (default: %(default)s)")
    parser.add_argument("--name", default="stub",
                        help="this backend's name, in every response (field 'backend', "
                             "and the id) and its --log (default: %(default)s)")
    parser.add_argument("--model", default="tiny",
                        help="the model id it serves (default: %(default)s)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--cache-blocks", type=int, default=256)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--prefill-delay", type=float, default=0.0)
    parser.add_argument("--token-delay", type=float, default=0.0)
    parser.add_argument("--log", default=None)
    parser.add_argument("--fault", default="none", choices=FAULT_MODES[:1] + FAULT_MODES[2:],
                        help="start in this fault mode")
    parser.add_argument("--slow-seconds", type=float, default=2.0)
    parser.add_argument("--huge-bytes", type=int, default=64 << 20)
    args = parser.parse_args(argv)
    options = StubOptions(
        name=args.name, model=args.model, block_size=args.block_size,
        cache_blocks=args.cache_blocks, max_num_seqs=args.max_num_seqs, delay=args.delay,
        prefill_delay=args.prefill_delay, token_delay=args.token_delay, log_path=args.log,
        slow_seconds=args.slow_seconds, huge_bytes=args.huge_bytes)

    async def run() -> None:
        stub = StubServer(options)
        port = await stub.start(args.host, args.port)
        await stub.set_fault(args.fault)
        print(f"ready {port}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await stub.stop()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0
