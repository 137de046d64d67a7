"""The `posab` command's subcommand of this name, kept for the commands in committed reports."""

import sys

from posab.cli import main

if __name__ == "__main__":
    sys.exit(main(["size-trend", *sys.argv[1:]]))
