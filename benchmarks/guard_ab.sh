#!/usr/bin/env bash
# The example guard, this checkout against an older commit, interleaved round by round (base, then this; each
# round a whole vs_optuna.py run: plain, cold, warm), so that both sides see the machine's same moods.
#
#   benchmarks/guard_ab.sh <commit> [rounds]      # e.g. benchmarks/guard_ab.sh 0535e9a 3   (about 4 min a round)
#
# Prints each round's table rows, and keeps each run's whole output (with every trial's runtimes and timeline)
# under $OUT (default /tmp/guard-ab). The older commit is checked out in a worktree, removed at the end.
set -euo pipefail
base=${1:?a commit to compare against}
rounds=${2:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/guard-ab}
tree=$(mktemp -d /tmp/guard-ab-tree-XXXXXX)
mkdir -p "$out"
git -C "$here" worktree add -q --detach "$tree" "$base"
trap 'git -C "$here" worktree remove --force "$tree"' EXIT
for round in $(seq "$rounds"); do
  for side in base head; do
    if [ "$side" = base ]; then root=$tree; else root=$here; fi
    echo "=== round $round, $side ($(git -C "$root" rev-parse --short HEAD)), $(date +%T)"
    (cd "$root" && PYTHONPATH=$root python benchmarks/vs_optuna.py --objective example --rounds 1 \
      --arms plain,cold,warm > "$out/$round-$side.log" 2>&1)
    grep -E '^\| example' "$out/$round-$side.log"
  done
done
