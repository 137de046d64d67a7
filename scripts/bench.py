"""Performance benchmark of the encodings; see `posab.bench` for what each section measures.

    python scripts/bench.py [--quick] [--out DIR] [--sections 1,2,3,4,5] [--repeats N] [--threads N]
                            [--no-progress]

Writes one CSV per section, targets.csv and bench.md (every table, the machine and the method) into
--out: by default results/bench for a full run and outputs/bench_quick for a `--quick` one, so that a
quick run never replaces the committed results/bench tables.
"""

import sys

from posab.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
