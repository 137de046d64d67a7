"""The encoding lists the experiment presets sweep, derived from the config tree (issue 42, part 4).

A new encoding is two files, its class and `conf/encoding/<name>.yaml`. A preset that covers every encoding
does not list them: it sweeps `encoding: ${posab_encodings:}`, and where it needs the encodings whose
optimizer settings (`encoding.lr_mult`) act on something, `${posab_encodings_with_parameters:}`. Both
resolve, when Hydra composes the preset, to the comma-separated options of the `encoding` group as Hydra
itself finds them: every `encoding/*.yaml` of the run's config sources (`conf/`, a `--config-dir`,
`hydra.searchpath`), read from the composed config's `hydra.runtime.config_sources`. A config without them
(one composed without its `hydra` node) falls back on `posab.paths.conf_dir()`.

Order. A sweep numbers its jobs in the order of its values, and a job's folder is named by its number
(`3_encoding=alibi,seed=0`, posab.job_names); a sweep rerun into its folder finds its finished jobs by that
name. So the twelve encodings the presets once listed by hand keep the order they had (LEGACY_ORDER: every
job of `encodings`, `tiny_grid` and `tune_lr` keeps its number and folder), and every later encoding
follows them, sorted by name. LEGACY_ORDER is history: a new encoding is never added to it.

Parameters. An encoding has parameters when the class its yaml names, built from the yaml's settings at
small model sizes (PROBE_SIZES), has a trainable parameter: what the optimizer gives its own group
(posab.training.optim takes the parameters that require a gradient). A setting the command line changes
(`encoding.learn_scale=false`) is not seen: the list is the yamls' defaults.

Importing this module registers both resolvers; Hydra imports it when it starts (src/hydra_plugins/
posab_sweep_lists), before it composes a config.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from posab.paths import conf_dir, encoding_names

if TYPE_CHECKING:  # Hydra's internals are imported where they are used (this module loads with Hydra)
    from hydra._internal.config_repository import ConfigRepository

GROUP = "encoding"  # the config group of the encodings: conf/encoding/*.yaml
EVERY_ENCODING = "posab_encodings"
WITH_PARAMETERS = "posab_encodings_with_parameters"
# The order of the hand-written lists this module replaced (conf/experiment/encodings.yaml before issue 42);
# kept so that no existing job changes its number. Never extended: later encodings follow, sorted by name.
LEGACY_ORDER = (
    "nope",
    "sinusoidal",
    "learned",
    "alibi",
    "rope",
    "t5",
    "fire",
    "kerple",
    "multiscale",
    "hierarchical",
    "dape_alibi",
    "dape_multiscale",
)
# Model sizes an encoding is built at to see whether it has parameters: whether it has one does not depend
# on them, so the smallest that every encoding accepts (2 heads: ALiBi's slopes; 2 layers: DAPE's per-layer
# mixers are built for each) keep building all of them quick; the seed only sets values, any will do.
PROBE_SIZES = {"d_model": 16, "n_heads": 2, "train_len": 16, "max_positions": 64, "seed": 0, "n_layers": 2}


def sweep_order(names: Iterable[str]) -> list[str]:
    """`names` in sweep order: those of LEGACY_ORDER in its order, then the rest sorted by name."""
    given = set(names)
    return [n for n in LEGACY_ORDER if n in given] + sorted(given - set(LEGACY_ORDER))


def _repository(root: DictConfig) -> ConfigRepository | None:
    """Hydra's config repository over the sources the config was composed from; None without them (a
    config composed without its `hydra` node, or loaded by OmegaConf alone)."""
    sources = OmegaConf.select(root, "hydra.runtime.config_sources", default=None)
    if not sources:
        return None
    from hydra._internal.config_repository import ConfigRepository
    from hydra._internal.config_search_path_impl import ConfigSearchPathImpl

    search_path = ConfigSearchPathImpl()
    for source in sources:
        search_path.append(source.provider, f"{source.schema}://{source.path}")
    return ConfigRepository(search_path)


def group_nodes(root: DictConfig) -> dict[str, DictConfig]:
    """Every option of the `encoding` group -> its yaml as loaded (unresolved), in sweep order."""
    repository = _repository(root)
    if repository is None:
        conf = conf_dir()
        loaded = {name: OmegaConf.load(conf / GROUP / f"{name}.yaml") for name in encoding_names(conf)}
    else:
        names = repository.get_group_options(GROUP)
        loaded = {name: repository.load_config(f"{GROUP}/{name}").config for name in names}
    return {name: loaded[name] for name in sweep_order(loaded)}


def resolved_node(root: DictConfig, node: DictConfig) -> dict[str, Any]:
    """An encoding's yaml as a plain dict, its interpolations resolved as they would be in `root` (the
    composed config, without its `hydra` node) with this yaml as its `encoding`."""
    scratch = OmegaConf.masked_copy(root, [key for key in root if key != "hydra"])
    OmegaConf.set_readonly(scratch, False)
    OmegaConf.set_struct(scratch, False)
    scratch[GROUP] = node
    spec = OmegaConf.to_container(scratch[GROUP], resolve=True)
    assert isinstance(spec, dict)
    return {str(key): value for key, value in spec.items()}


def has_parameters(spec: Mapping[str, Any]) -> bool:
    """Whether the encoding an `encoding` config node describes has a trainable parameter, built at
    PROBE_SIZES. Building it draws from torch's global generator; its state is restored afterwards."""
    import torch

    from posab.encodings import Dims, build_encoding

    with torch.random.fork_rng(devices=[]):
        encoding = build_encoding(dict(spec), Dims(**PROBE_SIZES))
    return any(p.requires_grad and p.numel() > 0 for p in encoding.parameters())


def every_encoding(*, _root_: DictConfig) -> str:
    """`${posab_encodings:}`: every encoding, comma-separated in sweep order (a sweep's values)."""
    return ",".join(group_nodes(_root_))


def encodings_with_parameters(*, _root_: DictConfig) -> str:
    """`${posab_encodings_with_parameters:}`: the encodings that have parameters, as `every_encoding`."""
    nodes = group_nodes(_root_)
    return ",".join(name for name, node in nodes.items() if has_parameters(resolved_node(_root_, node)))


for _name, _resolver in ((EVERY_ENCODING, every_encoding), (WITH_PARAMETERS, encodings_with_parameters)):
    if not OmegaConf.has_resolver(_name):
        OmegaConf.register_new_resolver(_name, _resolver)
