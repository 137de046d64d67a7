"""Train and evaluate one positional-encoding configuration: `python train.py encoding=alibi`."""

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from posab.errors import ConfigError
from posab.run import main


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def entry(cfg: DictConfig) -> None:
    try:
        main(cfg, Path(HydraConfig.get().runtime.output_dir))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    entry()
