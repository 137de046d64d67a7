"""The audit's pull past the training length for runs made before the audit had it.

    python scripts/audit_backfill.py RUN_DIR [RUN_DIR ...]

See `posab.evaluate.pull_backfill`.
"""

import sys

from posab.evaluate.pull_backfill import main

if __name__ == "__main__":
    sys.exit(main())
