"""`posab check-device [--device cuda] [--encodings a,b] [--model NAME] [--seq-len L] [--batch B]
[--repeats N] [--seed S] [--out DIR]`: whether a machine computes every encoding's model as the CPU does
in float64, before a run on it is trusted.

Whether the multi-scale bias breaks was seen to depend on rounding, so for every encoding (every
conf/encoding/*.yaml, or `--encodings`) the same weights (drawn once from a fixed seed on the CPU) and the
same batch (seeded tokens with sentence and paragraph indices) are run on the chosen device in fp32 and
under bf16 autocast, and on the CPU in float64. Each row reports the scale-relative error
max |device - reference| / max |reference| of the logits at the training length L and at 4L (evaluation
mode) and of the gradient of the next-token loss at L with respect to every parameter (training mode), a
verdict (pass: everything finite and every error within the precision's tolerance), and a training step's
median time, tokens per second and peak memory on the device (`posab.bench.device_step`). The model is the
`tiny` experiment's with its L (128) unless `--model` (conf/model/NAME.yaml) and `--seq-len` say
otherwise; dropout is off, so that the two sides compute the same function.

Tolerances (`posab.bench.device_checks.TOLERANCES`), in units of each precision's eps:

- fp32, 1e-4 (~840 eps32, eps32 = 2^-23 ~ 1.2e-7). Each logit ends a chain of sums: dot products over
  d_model and the MLP width, attention over up to 4L keys, the layer norms, in each of the n_layers
  blocks. A sum of n terms is off by at most ~n eps of its terms' magnitudes and typically by ~sqrt(n) eps,
  and the layers' errors add: for the presets (at most 6 layers, sums of up to 4L = 2048 terms) that is
  ~6 sqrt(2048) eps32 ~ 3e-5 typically (measured on the CPU: 2e-7 to 4e-6, tiny at L = 128 and small at
  L = 512). A bug (a wrong index, a lost term) or a silent loss of precision (TF32 matmuls keep 10 bits:
  eps 2^-10 ~ 1e-3) is above it.
- bf16, 5e-2 (~6.4 eps_bf16, eps_bf16 = 2^-7 ~ 7.8e-3). Autocast rounds every matmul's inputs to bf16's 8
  significant bits (accumulating in fp32; norms, softmax and the loss stay in fp32), so each matmul is off
  by a few units of bf16's rounding, ~eps_bf16 relative, and the layers' errors add along the residual
  stream: measured 1e-3 to 8e-3 for the tiny and small models, ~1 eps_bf16. 5e-2 leaves room for depth
  and longer sums; an error beyond it is not bf16's rounding noise but a quantity that loses its meaning
  in bf16 (integers are exact in bf16 only up to 256: distances 257 and 258 are one number), an overflow,
  a bug.

The float64 reference computes every operation in float64 but one: the CPU training path's chunked
attention backward forms the probabilities and accumulates dK and dV in float32 even for float64 inputs.
Its gradient is still exact to ~1e-8 of its scale (7e-9 to 2e-8 against float64 autograd through the
same model, tiny at L = 128), 20 times below fp32's own error and far below both tolerances.

Prints a markdown table (one row per encoding x precision) under a header naming the device, torch and the
dtypes supported; `--out DIR` also writes it as check_device.md and the rows as check_device.csv. Exit
code 0 when every check passes, 1 when one fails, 2 for a bad argument (a device or encoding that is not
there).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from posab.bench import device_report
from posab.bench.device_checks import FAIL, Plan, Row, check_encoding
from posab.bench.settings import positive
from posab.config import Config, load_config
from posab.errors import ConfigError
from posab.evaluate import evaluator_classes
from posab.paths import conf_dir, encoding_names

EXPERIMENT = "tiny"  # the preset whose model and training length are checked by default


def valid_devices() -> list[str]:
    """The devices this machine has, as `--device` takes them."""
    devices = ["cpu"]
    if torch.cuda.is_available():
        devices += ["cuda", *(f"cuda:{i}" for i in range(torch.cuda.device_count()))]
    if torch.backends.mps.is_available():
        devices.append("mps")
    return devices


def resolve_device(name: str | None) -> torch.device:
    """`--device`: cuda when there is one, else cpu, when not given; a ConfigError naming the devices
    that are valid here when `name` is not one of them."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    valid = ", ".join(valid_devices())
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"--device {name!r} is not a device name; valid here: {valid}") from None
    if device.type == "cpu":
        return torch.device("cpu")  # cpu:0 is the one CPU device
    if device.type == "cuda" and not torch.cuda.is_available():
        build = "built without CUDA" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        raise ConfigError(
            f"--device {name}: CUDA is not available (torch {torch.__version__}, {build}, no GPU visible); "
            f"valid here: {valid}"
        )
    if str(device) not in valid_devices():
        raise ConfigError(f"--device {name}: no such device on this machine; valid here: {valid}")
    return device


def chosen_encodings(text: str | None) -> list[str]:
    """`--encodings a,b` (every conf/encoding/*.yaml when not given); a ConfigError listing the valid
    names when one is not."""
    known = encoding_names()
    if text is None:
        return known
    names = list(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise ConfigError(f"--encodings: unknown {unknown or text!r}; valid: {', '.join(known)}")
    return names


def composed(overrides: list[str]) -> Config:
    """The run config `python train.py OVERRIDES` would use, validated."""
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return load_config(compose(config_name="config", overrides=overrides))


def base_overrides(model: str | None, seq_len: int | None) -> list[str]:
    """The preset, with `--model` and `--seq-len` when given (a ConfigError for a model that has no file)."""
    overrides = [f"+experiment={EXPERIMENT}", "model.dropout=0.0"]
    if model is not None:
        models = sorted(p.stem for p in (conf_dir() / "model").glob("*.yaml"))
        if model not in models:
            raise ConfigError(f"--model {model!r}: no conf/model/{model}.yaml; valid: {', '.join(models)}")
        overrides.append(f"model={model}")
    if seq_len is not None:
        overrides.append(f"train.seq_len={seq_len}")
    return overrides


def encoding_configs(names: list[str], model: str | None, seq_len: int | None) -> dict[str, Config]:
    """Each encoding's config: the preset at its training length L, with eval.lengths [L, 4L] so that a
    learned position table covers the longer batch, and every evaluator off (none runs here; their settings,
    such as the shift evaluation's prefix lengths below L, would otherwise bound `--seq-len`)."""
    overrides = base_overrides(model, seq_len)
    length = composed(overrides).train.seq_len
    overrides += [f"train.seq_len={length}", f"eval.lengths=[{length},{4 * length}]"]
    overrides += [f"eval.{evaluator.name}.enabled=false" for evaluator in evaluator_classes()]
    return {name: composed([*overrides, f"encoding={name}"]) for name in names}


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="posab check-device",
        description="every encoding on a device (fp32, bf16 autocast) against the CPU in float64",
    )
    parser.add_argument("--device", help="cpu, cuda, cuda:N (default: cuda when there is one, else cpu)")
    parser.add_argument("--encodings", help="a,b: only these (default: every conf/encoding/*.yaml)")
    parser.add_argument("--model", help=f"conf/model/NAME.yaml (default: the {EXPERIMENT} experiment's)")
    parser.add_argument("--seq-len", type=positive, help="training length L; logits also at 4L (default 128)")
    parser.add_argument("--batch", type=positive, default=2, help="sequences per batch (default 2)")
    parser.add_argument("--repeats", type=positive, default=5, help="timed training steps (default 5)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and batches (default 0)")
    parser.add_argument("--out", type=Path, help="also write check_device.md and check_device.csv here")
    return parser


def run(args: argparse.Namespace) -> list[Row]:
    """Print the header, check every encoding, print the table (and write it with `--out`); returns the
    rows. A bad argument raises its ConfigError before anything is printed."""
    device = resolve_device(args.device)
    configs = encoding_configs(chosen_encodings(args.encodings), args.model, args.seq_len)
    first = next(iter(configs.values()))
    plan = Plan(device, first.train.seq_len, args.batch, args.seed, args.repeats)
    head = device_report.header(plan, first, args.model or EXPERIMENT)
    print(head + "\n", flush=True)  # before the checks: what is being checked, while they run
    rows = [row for name, cfg in configs.items() for row in check_encoding(name, cfg, plan)]
    table = device_report.markdown(rows)
    print(table)
    if args.out is not None:
        written = device_report.write(args.out, f"{head}\n\n{table}", rows, plan)
        print("\nwrote " + " and ".join(str(path) for path in written))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Check every chosen encoding; print the table. 0: all pass, 1: a check failed, 2: a bad argument."""
    args = parser().parse_args(argv)
    try:
        rows = run(args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 1 if any(row.verdict == FAIL for row in rows) else 0
