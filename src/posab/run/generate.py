"""Continue a prompt with a finished run's model (cached decoding): `posab generate`.

    posab generate outputs/runs/RUN --prompt "The river" --steps 64
    posab generate RUN --prompt-ids 256,258,84,104,101 --temperature 0.8 --top-k 40 --seed 1 --json

The prompt is encoded with the run's tokenizer (a BPE run keeps its own in its folder, so a copied folder
generates with no corpus and no token cache) as the start of a document (with anchors: BOS, PARA, the text,
SENT before each later sentence; no EOS), or given as ids. Tokens are chosen greedily (`--temperature 0`, the
default) or drawn from softmax(logits / T) over the `--top-k` largest, seeded by `--seed`
(`posab.decoding.generate`); the sentence and paragraph indices of the new tokens come from the data's own
rule (`posab.data.structure.StructureTracker`). Prints the prompt and the continuation as text
(`--show-anchors`: anchors as <bos>, <para>, ...), or with `--json` also their ids. The default precision,
fp32, gives the logits the cached decoding is tested against; `--precision auto` uses bf16 where the
hardware has it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from posab.build import build_model
from posab.config import Config, load_config
from posab.data import run_tokenizer
from posab.data.structure import structure_tracker
from posab.data.tokenizer import EOS, Tokenizer
from posab.decoding import generate
from posab.device import autocast, autocast_dtype, resolve_device
from posab.errors import ConfigError, require
from posab.model import DecoderLM
from posab.run.directory import CHECKPOINTS, load_model_state


@dataclass
class Generator:
    """A finished run's model, ready to continue prompts."""

    cfg: Config
    model: DecoderLM
    tokenizer: Tokenizer
    device: torch.device
    dtype: torch.dtype | None  # the autocast dtype, None for fp32


def load_run(run_dir: Path, checkpoint: str, device: str, precision: str) -> Generator:
    """The model of `run_dir`'s checkpoint `checkpoint` (a CHECKPOINTS key) on `device`, and its tokenizer."""
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"'{run_dir}' holds no config.yaml (is it a run directory?)")
    path = run_dir / CHECKPOINTS[checkpoint]
    if not path.is_file():
        held = [kind for kind, name in CHECKPOINTS.items() if (run_dir / name).is_file()]
        raise ConfigError(
            f"'{run_dir}' has no {CHECKPOINTS[checkpoint]} (--checkpoint {checkpoint}); "
            f"it holds {', '.join(f'--checkpoint {kind}' for kind in held) or 'no checkpoint'}"
        )
    cfg = load_config(OmegaConf.load(run_dir / "config.yaml"))  # type: ignore[arg-type]
    tokenizer = run_tokenizer(cfg.data, run_dir)  # the folder's own BPE, where it keeps one
    model = build_model(cfg, tokenizer.vocab_size)
    load_model_state(cfg, model, path)
    where = resolve_device(device)
    return Generator(cfg, model.to(where).eval(), tokenizer, where, autocast_dtype(precision, where))


def prompt_ids(text: str | None, ids: str | None, tokenizer: Tokenizer) -> list[int]:
    """The prompt's ids: `text` encoded as the start of a document (no EOS), or the comma-separated `ids`."""
    if ids is not None:
        try:
            values = [int(part) for part in ids.split(",") if part.strip()]
        except ValueError:
            raise ConfigError(
                f"--prompt-ids {ids!r}: give comma-separated integers, e.g. 256,258,72"
            ) from None
        require(bool(values), "--prompt-ids is empty: give at least one id")
        bad = [v for v in values if not 0 <= v < tokenizer.vocab_size]
        require(not bad, f"--prompt-ids {bad}: outside the run's vocabulary 0..{tokenizer.vocab_size - 1}")
        return values
    require(bool(text), "--prompt is empty: give some text to continue")
    encoded = tokenizer.encode(str(text), document=True).tokens.tolist()
    return encoded[:-1] if tokenizer.anchors and encoded[-1] == EOS else encoded  # the document goes on


def continuation(run: Generator, prompt: list[int], args: argparse.Namespace) -> list[int]:
    """`args.steps` new ids after `prompt`, chosen as the arguments say."""
    tokens = torch.tensor([prompt], dtype=torch.long, device=run.device)  # (1, T)
    generator = torch.Generator().manual_seed(args.seed)
    with autocast(run.device, run.dtype):
        ids = generate(
            run.model,
            tokens,
            args.steps,
            temperature=args.temperature,
            top_k=args.top_k,
            generator=generator,
            structure=[structure_tracker(run.tokenizer)],
        )
    return ids[0].tolist()


def record(run: Generator, prompt: list[int], ids: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """What `--json` prints: the settings, the ids and the text of the prompt and the continuation."""
    show = args.show_anchors
    return {
        "run_dir": str(args.run_dir),
        "checkpoint": args.checkpoint,
        "steps": args.steps,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "seed": args.seed,
        "prompt_ids": prompt,
        "ids": ids,
        "prompt": run.tokenizer.decode(prompt, show_special=show),
        "text": run.tokenizer.decode(ids, show_special=show),
    }


def text_view(out: dict[str, Any]) -> str:
    """The prompt and the continuation as the plain output shows them."""
    how = "greedy" if out["temperature"] == 0 else f"temperature {out['temperature']}, seed {out['seed']}"
    if out["top_k"] is not None and out["temperature"] != 0:
        how += f", top-k {out['top_k']}"
    return (
        f"--- prompt ({len(out['prompt_ids'])} tokens)\n{out['prompt']}\n"
        f"--- continuation ({len(out['ids'])} tokens, {how})\n{out['text']}"
    )


def check_args(args: argparse.Namespace) -> None:
    require(args.steps >= 1, f"--steps {args.steps}: generate at least one token")
    require(args.temperature >= 0, f"--temperature {args.temperature}: use 0 (greedy) or a positive value")
    require(args.top_k is None or args.top_k >= 1, f"--top-k {args.top_k}: use a positive number")


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="posab generate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dir", type=Path, help="a run's directory (config.yaml, checkpoint.pt)")
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="text to continue, encoded with the run's tokenizer")
    prompt.add_argument("--prompt-ids", help="token ids to continue, comma-separated")
    parser.add_argument("--steps", type=int, default=64, help="tokens to generate (default 64)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); > 0: sampled")
    parser.add_argument("--top-k", type=int, help="sample from the K most likely tokens only")
    parser.add_argument("--seed", type=int, default=0, help="the sampling generator's seed (default 0)")
    parser.add_argument("--checkpoint", choices=sorted(CHECKPOINTS), default="latest", help="default latest")
    parser.add_argument("--device", default="auto", help="auto (default) | cpu | cuda")
    parser.add_argument("--precision", choices=("fp32", "bf16", "auto"), default="fp32", help="default fp32")
    parser.add_argument("--show-anchors", action="store_true", help="show anchors as <bos>, <para>, ...")
    parser.add_argument("--json", action="store_true", help="print ids and text as JSON")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        check_args(args)
        run = load_run(args.run_dir, args.checkpoint, args.device, args.precision)
        prompt = prompt_ids(args.prompt, args.prompt_ids, run.tokenizer)
        out = record(run, prompt, continuation(run, prompt, args), args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(out, ensure_ascii=False) if args.json else text_view(out))
    return 0
