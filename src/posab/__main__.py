"""`python -m posab COMMAND ...`, the same as the `posab` command."""

import sys

from posab.cli import main

sys.exit(main())
