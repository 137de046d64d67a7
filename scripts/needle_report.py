"""Retrieval summary of runs with a passkey stage (needle by length, stage curves).

    python scripts/needle_report.py outputs/multirun/SWEEP [RUN_DIR ...] --out results/needle_pilot

See `posab.needle_report`.
"""

import sys

from posab.needle_report import main

if __name__ == "__main__":
    sys.exit(main())
