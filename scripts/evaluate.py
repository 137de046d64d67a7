"""Re-evaluate a finished run without retraining.

    python scripts/evaluate.py outputs/runs/RUN eval.lengths=[512,1024,2048,4096,8192]
    python scripts/evaluate.py RUN eval.perplexity.stride=256 eval.needle.enabled=false --out DIR

Overrides may change `eval.*`, `train.device`, `train.precision` and where the data is
(`data.path`, `data.cache_dir`); the results go to RUN/eval/<time>/ (or --out DIR), and the run's
end-of-run table is printed for them.
"""

import argparse
import sys
import time
from pathlib import Path

from posab.errors import ConfigError
from posab.run import reevaluate
from posab.summary import summary_text


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dir", type=Path, help="a finished run's directory (config.yaml, checkpoint.pt)")
    parser.add_argument(
        "overrides", nargs="*", help="KEY=VALUE: eval.*, train.device, train.precision, data.*"
    )
    parser.add_argument("--out", type=Path, help="folder for the results (default RUN_DIR/eval/<time>)")
    return parser.parse_intermixed_args(argv)


def main() -> None:
    args = parse(sys.argv[1:])
    out = args.out or args.run_dir / "eval" / time.strftime("%Y-%m-%d_%H-%M-%S")
    try:
        results = reevaluate(args.run_dir, args.overrides, out)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    print(summary_text({"eval": results}, out))


if __name__ == "__main__":
    main()
