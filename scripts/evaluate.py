"""Re-evaluate a finished run without retraining.

    python scripts/evaluate.py run_dir=outputs/runs/RUN eval.lengths=[512,1024,2048,4096,8192]
    python scripts/evaluate.py run_dir=RUN eval.perplexity.stride=256 eval.needle.enabled=false out=DIR

Overrides may change `eval.*`, `train.device`, `train.precision` and where the data is
(`data.path`, `data.cache_dir`); the results go to RUN/eval/<time>/ (or `out=DIR`).
"""

import json
import sys
from pathlib import Path

from posab.errors import ConfigError
from posab.results import scalars
from posab.run import reevaluate


def parse(argv: list[str]) -> tuple[Path, list[str], Path | None]:
    named = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in argv if a.startswith(("run_dir=", "out="))}
    if "run_dir" not in named:
        raise ConfigError("usage: python scripts/evaluate.py run_dir=RUN_DIR [eval.KEY=VALUE ...] [out=DIR]")
    overrides = [a for a in argv if not a.startswith(("run_dir=", "out="))]
    out = Path(named["out"]) if "out" in named else None
    return Path(named["run_dir"]), overrides, out


def main() -> None:
    try:
        results = reevaluate(*parse(sys.argv[1:]))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(scalars(results), indent=1))


if __name__ == "__main__":
    main()
