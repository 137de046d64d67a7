"""Each encoding's learning rate and encoding lr_mult, picked on the validation loss of a tuning sweep.

    python scripts/tuning.py outputs/multirun/SWEEP [DIR ...] --out results/NAME

See `posab.report.tuning`.
"""

import sys

from posab.report.tuning import main

if __name__ == "__main__":
    sys.exit(main())
