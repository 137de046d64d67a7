#!/usr/bin/env bash
# The task suite's budget pilot (issue 58; conf/experiment/tasks_pilot.yaml) run as a ladder that stops: per
# task, each budget in increasing order (both references x both pilot seeds), then `posab task-budgets`;
# the task's ladder stops at the first budget that teaches both references on every seed. That is the budget
# the whole ladder gives (the fewest that meets the rule), and a task learned at 2,000 steps costs 3,000 steps
# a run instead of 15,000. A task never learned runs the whole ladder, up to its cap.
#   bash scripts/pilot_ladder.sh SWEEP TASK [TASK ...]      (extra train.py overrides: PILOT_OVERRIDES)
#   posab task-budgets SWEEP --out results/tasks/pilot --cap 8000
# A rerun skips the budgets already finished (each run resumes or is skipped as train.py does).
set -euo pipefail
[[ $# -ge 2 ]] || { echo "usage: $0 SWEEP TASK [TASK ...]" >&2; exit 2; }
sweep=$(realpath -m "$1"); shift
cd "$(dirname "$0")/.."
python=${PYTHON:-python}
ladder=(1000 2000 4000 8000)  # the preset's train.steps (tests/test_task_budgets.py holds them equal)
cap=${ladder[-1]}
for task in "$@"; do
  for steps in "${ladder[@]}"; do
    # shellcheck disable=SC2086  # PILOT_OVERRIDES: several overrides, split on spaces
    "$python" train.py -m +experiment=tasks_pilot task="$task" train.steps="$steps" \
      hydra.sweep.dir="$sweep/$task/$steps" ${PILOT_OVERRIDES:-}
    posab task-budgets "$sweep/$task" --out "$sweep/$task/budgets" --cap "$cap" >/dev/null
    learned=$("$python" -c 'import csv, sys; print(next(csv.DictReader(open(sys.argv[1])))["learned"])' \
      "$sweep/$task/budgets/budgets.csv")
    echo "pilot: $task at $steps steps: learned=$learned"
    [[ $learned == True ]] && break
  done
done
