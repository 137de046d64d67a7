"""Where a study's ranking by validation loss stops changing (the study's budget).

    python scripts/budget.py outputs/multirun/SWEEP [DIR ...] --out results/NAME [--minimum 600]

See `posab.report.budget`.
"""

import sys

from posab.report.budget import main

if __name__ == "__main__":
    sys.exit(main())
