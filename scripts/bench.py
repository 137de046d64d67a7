"""Performance benchmark of the encodings; see `posab.bench` for what each section measures.

    python scripts/bench.py [--quick] [--out results/bench] [--sections 1,2,3,4,5] [--repeats N] [--threads N]

Writes one CSV per section, targets.csv and bench.md (every table, the machine and the method) into
--out (default results/bench).
"""

import sys

from posab.bench import main

if __name__ == "__main__":
    sys.exit(main())
