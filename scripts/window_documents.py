"""Each window's document (`window_documents`) for report folders written before runs recorded it.

    python scripts/window_documents.py results/study/main [FOLDER ...] [--root DIR]

Rebuilds each run's evaluation split from its config in FOLDER/configs/ and rewrites FOLDER/runs.csv with
the new column; see `posab.report.window_documents`.
"""

import sys

from posab.report.window_documents import main

if __name__ == "__main__":
    sys.exit(main())
