"""Atomic file writes: a reader sees the old file or the new one, never half of one. What they write has
the permissions a plain write would give (tempfile's own are owner-only: a results file or a shared data
cache others on the machine could not read)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _read_umask() -> int:
    """The process's umask (read at import, in the importing thread: setting it to read it is a race)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


UMASK = _read_umask()


def plain_mode(path: Path, directory: bool = False) -> int:
    """The permissions `open(path, "w")` (or `mkdir`) would leave: an existing file's own, else the
    umask's."""
    if not directory and path.is_file():
        return path.stat().st_mode & 0o7777
    return (0o777 if directory else 0o666) & ~UMASK


def atomic_write(path: Path, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp)` on a temporary file beside `path`, then rename it onto `path`.

    The temporary file is removed when `write` or the rename fails, so nothing is left behind.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        tmp.chmod(plain_mode(path))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_text(path: Path, text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_json(path: Path, payload: dict[str, Any]) -> Path:
    """Indented JSON; values JSON does not know (paths, numpy scalars) are written as strings."""
    return write_text(path, json.dumps(payload, indent=2, default=str))


def publish_directory(folder: Path, fill: Callable[[Path], None]) -> Path:
    """Call `fill(staging)` on a new folder beside `folder`, then rename it onto `folder` in one step.

    Readers see the complete folder or none. When another process has published `folder` first (the
    rename fails because it exists), its folder is kept and ours dropped. The staging folder never stays.
    """
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=folder.name + ".tmp"))
    try:
        fill(staging)
        staging.chmod(plain_mode(folder, directory=True))
        os.replace(staging, folder)
    except OSError:
        if not folder.is_dir():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder
