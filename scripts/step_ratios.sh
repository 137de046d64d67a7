#!/usr/bin/env bash
# A refactor's training-step cost, held to the code before it (issue 57): the benchmark's section 2 (one
# training step per encoding, bf16 autocast, 16 x 512, ratios to NoPE's step in the same run) from worktrees
# of two commits, alternated BEFORE, AFTER, BEFORE, AFTER so that drift on the machine falls on both alike.
# Run it on a quiet machine (nothing else on the cores; pause long jobs: kill -STOP / -CONT their pids):
#   bash scripts/step_ratios.sh dabfca3 HEAD OUT [REPEATS]     # REPEATS: 15 (a rerun agrees at 15)
#   ENCODINGS=nope,alibi,xpos bash scripts/step_ratios.sh ...  # a rerun of some encodings (NoPE among them)
# Each round's section-2 table lands in OUT/<round>_<commit>/ (section2_train_step.csv, bench.md).
set -euo pipefail
before=$1
after=$2
out=$(realpath -m "$3")
repeats=${4:-15}
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$root/.venv/bin/python}
scratch=$(mktemp -d)
trap 'for t in "$scratch"/*; do git -C "$root" worktree remove --force "$t"; done' EXIT
for commit in "$before" "$after"; do
  git -C "$root" worktree add --detach "$scratch/$commit" "$commit" >/dev/null
done
for round in a b; do
  for commit in "$before" "$after"; do
    (cd "$scratch/$commit" && PYTHONPATH="$scratch/$commit/src" "$python" -m posab bench --sections 2 \
      --repeats "$repeats" --no-progress --out "$out/${round}_$commit" ${ENCODINGS:+--encodings "$ENCODINGS"})
  done
done
