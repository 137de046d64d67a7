#!/usr/bin/env bash
# A refactor changes no number: the tiny grid (every encoding x seeds 0, 1) in bf16 and fp32 at a commit,
# run from a worktree of it on one thread, for `posab compare-runs` to hold against another commit's:
#   bash scripts/bit_identity.sh BASE_COMMIT OUT/before && bash scripts/bit_identity.sh HEAD OUT/after
#   posab compare-runs OUT/before OUT/after     # exits 1 on any differing number
set -euo pipefail
commit=$1
out=$(realpath -m "$2")
root=$(cd "$(dirname "$0")/.." && pwd)
tree=$(mktemp -d)/tree
git -C "$root" worktree add --detach "$tree" "$commit" >/dev/null
trap 'git -C "$root" worktree remove --force "$tree"' EXIT
python=${PYTHON:-$root/.venv/bin/python}
for precision in bf16 fp32; do
  (cd "$tree" && PYTHONPATH="$tree/src" WANDB_MODE=offline "$python" train.py -m +experiment=tiny_grid \
    train.precision=$precision threads=1 logger=jsonl data.cache_dir="$out/cache" \
    hydra.sweep.dir="$out/$precision" hydra.sweep.subdir='${hydra.job.num}_${encoding.name}_s${seed}')
done
echo "$(git -C "$root" rev-parse "$commit")" > "$out/COMMIT"
