#!/usr/bin/env bash
# Extract the balancer files of verl's routing pull requests from a git checkout of verl's
# public repository into OUT, for affinity_conformance.pr_classes (AFFINITY_VERL_PRS=OUT).
#
#   scripts/extract_verl_prs.sh GITDIR OUT
#
# GITDIR is a verl git directory (bare or not) that has the refs/pull/N/head refs GitHub
# publishes (`git fetch origin '+refs/pull/*/head:refs/pull/*/head'`). Nothing extracted
# is part of this repository: OUT is written at run time and .gitignore keeps
# verl-prs/ out of commits. A ref the checkout lacks is reported and skipped (exit 0 as
# long as one entry was extracted), and OUT/MANIFEST.tsv records what was taken from
# which commit.
set -euo pipefail

if [ "$#" -ne 2 ]; then
    echo "usage: $0 GITDIR OUT  (GITDIR: a verl git directory with refs/pull/N/head)" >&2
    exit 2
fi
gitdir=$1
out=$2
if ! git --git-dir="$gitdir" rev-parse --git-dir >/dev/null 2>&1; then
    # A checkout with a work tree: use its .git.
    if git -C "$gitdir" rev-parse --git-dir >/dev/null 2>&1; then
        gitdir=$(git -C "$gitdir" rev-parse --absolute-git-dir)
    else
        echo "$0: $gitdir is not a git directory" >&2
        exit 2
    fi
fi

# key  ref  path-or-tree ("tree:" extracts a whole directory)
entries=(
    "head refs/heads/main verl/workers/rollout/llm_server.py"
    "pr5399 refs/pull/5399/head verl/experimental/agent_loop/agent_loop.py"
    "pr6122 refs/pull/6122/head verl/experimental/agent_loop/load_balance.py"
    "pr6533 refs/pull/6533/head verl/workers/rollout/llm_server.py"
    "pr6712 refs/pull/6712/head verl/workers/rollout/router.py"
    "pr6940 refs/pull/6940/head tree:verl/workers/rollout/llm_router"
    "pr7435 refs/pull/7435/head verl/workers/rollout/llm_server.py"
    "pr7613 refs/pull/7613/head verl/workers/rollout/llm_server.py"
)

mkdir -p "$out"
manifest="$out/MANIFEST.tsv"
printf 'key\tref\tcommit\tpath\n' >"$manifest"
extracted=0
for entry in "${entries[@]}"; do
    read -r key ref path <<<"$entry"
    commit=$(git --git-dir="$gitdir" rev-parse --verify --quiet "$ref^{commit}" || true)
    if [ -z "$commit" ]; then
        echo "skip $key: $ref is not in $gitdir" >&2
        printf '%s\t%s\t%s\t%s\n' "$key" "$ref" "missing" "$path" >>"$manifest"
        continue
    fi
    dest="$out/$key"
    rm -rf "$dest"
    mkdir -p "$dest"
    if [[ $path == tree:* ]]; then
        tree=${path#tree:}
        git --git-dir="$gitdir" archive "$commit" "$tree" | tar -x -C "$dest"
    else
        mkdir -p "$dest/$(dirname "$path")"
        git --git-dir="$gitdir" show "$commit:$path" >"$dest/$path"
    fi
    printf '%s\t%s\t%s\t%s\n' "$key" "$ref" "$commit" "$path" >>"$manifest"
    echo "$key: $ref ($commit) $path"
    extracted=$((extracted + 1))
done
if [ "$extracted" -eq 0 ]; then
    echo "$0: nothing extracted from $gitdir" >&2
    exit 1
fi
