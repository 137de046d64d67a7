"""Results report over run directories, sweeps or an earlier report's runs.csv.

    python scripts/report.py outputs/multirun/SWEEP [DIR ...] --out results/NAME

Writes report.md (one table per study, failed runs, commits, machines), runs.csv, the plots and
configs/ into the --out folder (default results/report); see `posab.report`.
"""

import sys

from posab.report import main

if __name__ == "__main__":
    sys.exit(main())
