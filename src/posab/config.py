"""Typed configuration schema.

Hydra composes YAML from `conf/`; `load_config` merges the result strictly into these dataclasses, so a
misspelt key or a value of the wrong type fails at start-up with a message naming the key. Everything
below `posab.run` receives these typed values, never a `DictConfig`.

The `encoding` group is the exception: each encoding has its own hyper-parameters, so its node is kept as
a plain dict and checked against the constructor of its `_target_` (see `posab.encodings.build`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from posab.encodings import encoding_class
from posab.encodings.rope import SCALINGS
from posab.errors import ConfigError


@dataclass
class ModelConfig:
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    mlp_ratio: int = 4
    dropout: float = 0.0
    attention: str = "sdpa"  # sdpa | flex (FlexAttention on GPUs, and in evaluation on the CPU)


@dataclass
class SyntheticConfig:
    seed: int = 0
    vocab_size: int = 2000
    train_docs: int = 400
    valid_docs: int = 40
    test_docs: int = 40


@dataclass
class DataConfig:
    source: str = "synthetic"  # synthetic | text | hub
    path: str | None = None  # text: a folder (with train/valid/test or not), a file, or a glob
    hub_dataset: str | None = None  # hub: e.g. Salesforce/wikitext
    hub_subset: str | None = None  # hub: e.g. wikitext-103-raw-v1
    hub_local_dir: str | None = None  # hub: an offline copy (parquet or text files) instead of the hub
    text_field: str = "text"
    anchors: bool = True
    tokenizer: str = "bytes"  # bytes | bpe (byte-level BPE trained on the train split)
    vocab_size: int = 4096  # bpe: ids in all (256 bytes, 4 anchors, merges); at most 65536
    needle_rate: float = 0.05  # share of training windows that are passkey examples (0 turns it off)
    cache_dir: str = ".cache/posab"
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)


@dataclass
class TrainConfig:
    seq_len: int = 512
    batch_size: int = 16
    grad_accum: int = 1
    steps: int = 600
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    precision: str = "auto"  # auto | bf16 | fp32
    device: str = "auto"  # auto | cpu | cuda
    val_every: int = 100
    val_windows: int = 32
    log_every: int = 10
    progress: bool = True
    compile: bool = False  # torch.compile the model for training
    checkpoint_every: int = 100
    keep_best: bool = False  # also keep checkpoint_best.pt (lowest validation loss)
    resume: str = "auto"  # auto: continue from the run directory's checkpoint if it has one | never
    overwrite: bool = False  # allow reusing the directory of a finished run


@dataclass
class PerplexityConfig:
    enabled: bool = True
    token_budget: int = 32768  # tokens scored per length: windows = max(1, budget // length)
    windows: int | None = None  # a fixed number of windows per length instead of the budget
    position_bins: int = 32  # per-position loss: equal-width bins over each window
    stride: int | None = None  # also report sliding-window perplexity with this stride


@dataclass
class NeedleConfig:
    enabled: bool = True
    lengths: list[int] | None = None  # None: eval.lengths
    depths: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    trials: int = 10
    key_digits: int = 5
    seed: int = 1234


@dataclass
class ShiftConfig:
    enabled: bool = True
    offsets: list[int] = field(default_factory=lambda: [1, 64, 512, 4096])
    prefix_lengths: list[int] = field(default_factory=lambda: [64, 256, 1024])
    windows: int = 8  # validation windows of the training length


@dataclass
class AnalysisConfig:
    enabled: bool = False  # attention entropy and distance per layer and head; slow at long lengths
    windows: int = 2  # validation windows per length, one at a time
    lengths: list[int] | None = None  # None: eval.lengths; each at most max(eval.lengths)


@dataclass
class EvalConfig:
    lengths: list[int] = field(default_factory=lambda: [512, 1024, 2048, 4096])
    batch_tokens: int = 16384  # batch size per length = max(1, batch_tokens // length)
    progress: bool = True
    # RoPE models only, at lengths past the training length: extra perplexity rows `ppl@KIND/L`
    rope_scaling: list[str] = field(default_factory=lambda: ["none", "pi", "ntk", "yarn"])
    rope_scaling_factor: float | None = None  # None: s = L / training length; else this fixed s >= 1
    perplexity: PerplexityConfig = field(default_factory=PerplexityConfig)
    needle: NeedleConfig = field(default_factory=NeedleConfig)
    shift: ShiftConfig = field(default_factory=ShiftConfig)
    analysis: AnalysisConfig = field(default_factory=AnalysisConfig)


@dataclass
class LoggerConfig:
    backend: str = "wandb"  # wandb | jsonl (metrics.jsonl in the run directory is written either way)
    project: str = "posab"
    entity: str | None = None
    mode: str = (
        "auto"  # auto: online when a W&B API key is configured, else offline | offline | online | disabled
    )
    group: str | None = None  # None: the experiment name (in a multirun: the sweep folder's name)
    tags: list[str] = field(default_factory=list)
    log_checkpoint: bool = False  # upload the final checkpoint as a W&B artifact


@dataclass
class Config:
    encoding: dict[str, Any] = field(default_factory=dict)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    seed: int = 0
    experiment: str = "default"
    threads: int | None = None  # torch threads; None: all cores, shared out among parallel local jobs


def load_config(cfg: DictConfig) -> Config:
    """Merge a composed config strictly into the schema and validate it."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(Config), cfg)
        typed: Config = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except OmegaConfBaseException as err:
        raise ConfigError(_one_line(err)) from None
    validate(typed)
    return typed


def _one_line(err: OmegaConfBaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    key = getattr(err, "full_key", None)
    summary = lines[0] if lines else type(err).__name__
    return f"invalid config key '{key}': {summary}" if key else f"invalid config: {summary}"


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def validate(cfg: Config) -> None:
    """Check values that types alone cannot, before any work is done."""
    m, t = cfg.model, cfg.train
    for name in ("d_model", "n_layers", "n_heads", "mlp_ratio"):
        value = getattr(m, name)
        _require(value > 0, f"model.{name}={value} must be a positive integer")
    _require(m.attention in ("sdpa", "flex"), f"model.attention={m.attention!r}: use sdpa or flex")
    _require(
        m.d_model % m.n_heads == 0,
        f"model.d_model={m.d_model} is not divisible by model.n_heads={m.n_heads}",
    )
    names = (
        "seq_len",
        "batch_size",
        "grad_accum",
        "steps",
        "val_every",
        "val_windows",
        "log_every",
        "checkpoint_every",
    )
    for name in names:
        value = getattr(t, name)
        _require(value > 0, f"train.{name}={value} must be a positive integer")
    _require(t.lr > 0, f"train.lr={t.lr} must be positive")
    _require(t.resume in ("auto", "never"), f"train.resume={t.resume!r}: use auto or never")
    _require(t.warmup_steps >= 0, f"train.warmup_steps={t.warmup_steps} must be >= 0")
    _require(0 <= t.min_lr_ratio <= 1, f"train.min_lr_ratio={t.min_lr_ratio} must be in [0, 1]")
    precisions = ("auto", "bf16", "fp32")
    _require(t.precision in precisions, f"train.precision={t.precision!r}: use auto, bf16 or fp32")
    _require(t.device in ("auto", "cpu", "cuda"), f"train.device={t.device!r}: use auto, cpu or cuda")
    sources = ("synthetic", "text", "hub")
    _require(cfg.data.source in sources, f"data.source={cfg.data.source!r}: use one of {', '.join(sources)}")
    _require("_target_" in cfg.encoding, "encoding: no _target_; pick one with encoding=NAME")
    encoding_class(cfg.encoding)
    tokenizers = ("bytes", "bpe")
    _require(
        cfg.data.tokenizer in tokenizers,
        f"data.tokenizer={cfg.data.tokenizer!r}: use one of {', '.join(tokenizers)}",
    )
    _require(
        261 <= cfg.data.vocab_size <= 65536,
        f"data.vocab_size={cfg.data.vocab_size} must be in [261, 65536]: above the 256 bytes and 4 anchor "
        "tokens, and within 16-bit token ids",
    )
    _require(0 <= cfg.data.needle_rate <= 1, f"data.needle_rate={cfg.data.needle_rate} must be in [0, 1]")
    validate_eval(cfg.eval)
    _require(
        cfg.logger.backend in ("wandb", "jsonl"), f"logger.backend={cfg.logger.backend!r}: use wandb or jsonl"
    )
    modes = ("auto", "offline", "online", "disabled")
    _require(cfg.logger.mode in modes, f"logger.mode={cfg.logger.mode!r}: use one of {', '.join(modes)}")


def validate_eval(e: EvalConfig) -> None:
    _require(e.batch_tokens > 0, f"eval.batch_tokens={e.batch_tokens} must be positive")
    named_lengths = (
        ("eval.lengths", e.lengths),
        ("eval.needle.lengths", e.needle.lengths or []),
        ("eval.analysis.lengths", e.analysis.lengths or []),
    )
    for name, lengths in named_lengths:
        bad = [n for n in lengths if n < 1]
        _require(not bad, f"{name}={lengths}: every length must be >= 1 (bad: {bad})")
    kinds, factor, a = e.rope_scaling, e.rope_scaling_factor, e.analysis
    bad_kinds = sorted(set(kinds) - set(SCALINGS)) or sorted({k for k in kinds if kinds.count(k) > 1})
    _require(not bad_kinds, f"eval.rope_scaling={kinds}: each of {'/'.join(SCALINGS)} once; bad: {bad_kinds}")
    _require(factor is None or factor >= 1, f"eval.rope_scaling_factor={factor} must be >= 1, or null")
    _require(a.windows > 0, f"eval.analysis.windows={a.windows} must be positive")
    longest = max(e.lengths, default=0)
    too_long = [n for n in a.lengths or [] if n > longest]
    _require(not too_long, f"eval.analysis.lengths={a.lengths}: at most max(eval.lengths)={longest}")
    p, n, s = e.perplexity, e.needle, e.shift
    _require(p.token_budget > 0, f"eval.perplexity.token_budget={p.token_budget} must be positive")
    _require(p.windows is None or p.windows > 0, f"eval.perplexity.windows={p.windows} must be positive")
    _require(p.position_bins > 0, f"eval.perplexity.position_bins={p.position_bins} must be positive")
    _require(p.stride is None or p.stride > 0, f"eval.perplexity.stride={p.stride} must be positive")
    bad_depths = [d for d in n.depths if not 0 <= d <= 1]
    _require(not bad_depths, f"eval.needle.depths={n.depths}: depths must be in [0, 1] (bad: {bad_depths})")
    _require(n.trials > 0, f"eval.needle.trials={n.trials} must be positive")
    _require(1 <= n.key_digits <= 12, f"eval.needle.key_digits={n.key_digits} must be in [1, 12]")
    _require(s.windows > 0, f"eval.shift.windows={s.windows} must be positive")
    bad_shift = [k for k in s.offsets + s.prefix_lengths if k < 0]
    _require(not bad_shift, f"eval.shift offsets/prefix_lengths must be >= 0 (bad: {bad_shift})")
