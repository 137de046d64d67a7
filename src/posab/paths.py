"""Where posab's config tree is: one way to find `conf/`, for the report, the benchmark and the tests."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from posab.errors import ConfigError

CONF_ENV = "POSAB_CONF"  # an explicit config folder (e.g. for an installed, non-editable package)


def source_root() -> Path:
    """The checkout this package was imported from (src/posab/.. /..); may not exist for an installed one."""
    return Path(__file__).resolve().parents[2]


def conf_dir() -> Path:
    """The config folder: `$POSAB_CONF`, else `conf/` of the checkout posab runs from, else `./conf`.

    Raises a ConfigError naming every place tried when none holds `config.yaml` and `encoding/`: a report or
    benchmark never silently works with an empty encoding list."""
    candidates = [Path(os.environ[CONF_ENV])] if os.environ.get(CONF_ENV) else []
    candidates += [source_root() / "conf", Path.cwd() / "conf"]
    for path in candidates:
        if (path / "config.yaml").is_file() and (path / "encoding").is_dir():
            return path
    tried = ", ".join(str(p) for p in candidates)
    raise ConfigError(
        f"no posab config folder (config.yaml and encoding/) found; tried {tried}; "
        f"set {CONF_ENV}=/path/to/posab/conf or run from the posab checkout"
    )


def encoding_names(conf: Path | None = None) -> list[str]:
    """Every encoding with a config file, `conf/encoding/<name>.yaml`, sorted."""
    return sorted(p.stem for p in ((conf or conf_dir()) / "encoding").glob("*.yaml"))


def encoding_options(name: str, conf: Path | None = None) -> dict[str, Any]:
    """What `conf/encoding/<name>.yaml` sets, unresolved; {} where there is no such file."""
    path = (conf or conf_dir()) / "encoding" / f"{name}.yaml"
    if not name or not path.is_file():
        return {}
    options = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    return {str(k): v for k, v in options.items()} if isinstance(options, dict) else {}
