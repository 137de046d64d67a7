"""A multirun job's directory name, kept within the filesystem's limit on one name.

Hydra names a job's directory from its overrides (`3_encoding=alibi,seed=1`). A few overrides with an
absolute path (`eval.corpora=[{name:wikitext2,path:/abs/path/wiki.test.raw,...}]` beside five other keys)
pass the 255 bytes a Linux filesystem allows in one name (NAME_MAX), and the job dies with `OSError: [Errno
36] File name too long` after it has started. `job_subdir` keeps the name whole when it fits and otherwise
keeps a readable prefix and a hash of the whole; the full overrides are in the job's `.hydra/overrides.yaml`
and `config.yaml`. `conf/config.yaml` names jobs through the `posab_job_subdir` resolver, which importing
this module registers (train.py does, before Hydra composes).
"""

from __future__ import annotations

import hashlib

from omegaconf import OmegaConf

NAME_MAX = 255  # bytes in one file name on Linux filesystems (ext4, xfs, tmpfs)
HASH_CHARS = 10  # hex digits of the hash that stands for a cut name
RESOLVER = "posab_job_subdir"


def job_subdir(number: int | str, override_dirname: str, limit: int = NAME_MAX) -> str:
    """`NUMBER_OVERRIDES` when it fits in `limit` bytes (UTF-8), else `NUMBER_PREFIX-HASH`: as much of the
    overrides as fits, cut on a character boundary, then HASH_CHARS hex digits of the whole name."""
    whole = f"{number}_{override_dirname}" if override_dirname else str(number)
    encoded = whole.encode()
    if len(encoded) <= limit:
        return whole
    digest = hashlib.sha256(encoded).hexdigest()[:HASH_CHARS]
    room = limit - len(digest) - 1  # the prefix, then "-" and the digest
    prefix = encoded[:room].decode(errors="ignore").rstrip(",")
    return f"{prefix}-{digest}"


if not OmegaConf.has_resolver(RESOLVER):
    OmegaConf.register_new_resolver(RESOLVER, job_subdir)
