"""Re-evaluate a finished run without retraining.

    python scripts/evaluate.py outputs/runs/RUN eval.lengths=[512,1024,2048,4096,8192]
    python scripts/evaluate.py RUN eval.perplexity.stride=256 eval.needle.enabled=false --out DIR

Overrides may change `eval.*`, `train.device`, `train.precision`, where the data is (`data.path`,
`data.cache_dir`) and `encoding.clamp` between values that never act in training (null, `train`); the
results go to RUN/eval/<time>/ (or --out DIR), and the run's end-of-run table is printed for them.
With --as-run, --out DIR becomes a run directory of the changed configuration that the report reads:

    python scripts/evaluate.py RUN encoding.clamp=train --as-run --out sweeps/arm/RUN_clamp
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
    parser.add_argument(
        "--as-run", action="store_true", help="write --out as a run directory (config, record, curve)"
    )
    return parser.parse_intermixed_args(argv)


def main() -> None:
    args = parse(sys.argv[1:])
    out = args.out or args.run_dir / "eval" / time.strftime("%Y-%m-%d_%H-%M-%S")
    if args.as_run and args.out is None:
        print("error: --as-run needs --out DIR, a folder outside the run", file=sys.stderr)
        sys.exit(2)
    try:
        results = reevaluate(args.run_dir, args.overrides, out, as_run=args.as_run)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    print(summary_text({"eval": results}, out))


if __name__ == "__main__":
    main()
