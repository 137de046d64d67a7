"""Weights & Biases logging: one W&B run per job, offline unless an API key is configured.

History: `train/*`, `val/*` and the evaluation media (`eval/*`) against `trainer/step`. Evaluation
scalars (`ppl/4096`, `needle/acc`, `shift/offset512/kl`, ...) go into the run's summary, so that they are
columns of the runs table; curves and grids become tables and plots. The files of a run are written under
the job's run directory (`RUN_DIR/wandb/offline-run-*` offline; `wandb sync` uploads them later).
"""

from __future__ import annotations

import netrc
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import wandb

from posab.config import LoggerConfig

STEP = "trainer/step"
RUN_ID_FILE = "wandb_run_id.txt"  # in the run directory: a resumed job continues this W&B run
DEFAULT_HOST = "https://api.wandb.ai"
SHIFT_KEY = re.compile(r"shift/(offset|prefix)(\d+)/(\w+)")
SHIFT_METRICS = ("max_abs_logit", "kl", "top1_agree", "dloss")


def has_api_key() -> bool:
    """Whether W&B credentials are configured: `WANDB_API_KEY`, or a .netrc entry for the W&B host."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlsplit(os.environ.get("WANDB_BASE_URL") or DEFAULT_HOST).netloc
    path = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
    try:
        creds = netrc.netrc(str(path)).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(creds and creds[2])


def resolve_mode(mode: str) -> str:
    """The W&B mode: `WANDB_MODE` when set, else `mode`; `auto` is online with an API key, else offline."""
    chosen = os.environ.get("WANDB_MODE") or mode
    if chosen == "auto":
        return "online" if has_api_key() else "offline"
    return chosen


def scalars(results: dict[str, Any]) -> dict[str, int | float]:
    """The scalar results (curves, grids and other structures left out)."""
    return {k: v for k, v in results.items() if isinstance(v, int | float)}


def keyed_lengths(results: dict[str, Any], prefix: str) -> list[int]:
    """The lengths L of the keys `{prefix}/{L}`, in increasing order."""
    head = prefix + "/"
    return sorted(int(k[len(head) :]) for k in results if k.startswith(head) and k[len(head) :].isdigit())


def bin_centres(length: int, bins: int) -> list[float]:
    """Mean position of each of `bins` equal-width bins over a window (as `perplexity.binned` cuts it)."""
    edges = np.linspace(0, length, bins + 1).round().astype(int)
    return [(a + b - 1) / 2 for a, b in zip(edges[:-1], edges[1:], strict=True)]


def perplexity_media(results: dict[str, Any]) -> dict[str, Any]:
    """A table of perplexity per length and a line plot of perplexity against length."""
    lengths = keyed_lengths(results, "ppl")
    if not lengths:
        return {}
    keys, columns = ["loss", "ppl", "ppl_windows"], ["length", "loss", "ppl", "windows"]
    if f"ppl_sliding/{lengths[0]}" in results:
        keys.append("ppl_sliding")
        columns.append("ppl_sliding")
    rows = [[n, *(results[f"{key}/{n}"] for key in keys)] for n in lengths]
    table = wandb.Table(columns=columns, data=rows)
    plot = wandb.plot.line(table, "length", "ppl", title="Perplexity vs evaluation length")
    return {"eval/perplexity": table, "eval/ppl_vs_length": plot}


def position_media(results: dict[str, Any]) -> dict[str, Any]:
    """Binned loss over the positions of the window: one line per evaluation length."""
    lengths = keyed_lengths(results, "position_loss")
    if not lengths:
        return {}
    curves = [results[f"position_loss/{n}"] for n in lengths]
    plot = wandb.plot.line_series(
        xs=[bin_centres(n, len(curve)) for n, curve in zip(lengths, curves, strict=True)],
        ys=curves,
        keys=[f"L={n}" for n in lengths],
        title="Loss per position",
        xname="position",
    )
    return {"eval/position_loss": plot}


def needle_media(results: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """The passkey grid as a table of cells, and its heatmap from `run_dir` when drawn."""
    grid = results.get("needle/grid")
    if not grid:
        return {}
    rows = [
        [length, depth, grid["acc"][i][j], grid["logprob"][i][j]]
        for i, length in enumerate(grid["lengths"])
        for j, depth in enumerate(grid["depths"])
    ]
    table = wandb.Table(columns=["length", "depth", "acc", "logprob"], data=rows)
    media: dict[str, Any] = {"eval/needle": table}
    heatmap = run_dir / "needle_heatmap.png"
    if heatmap.is_file():
        media["eval/needle_heatmap"] = wandb.Image(str(heatmap))
    return media


def attention_media(results: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """The attention analysis as a table (length, layer, head, entropy, distance) and its plot."""
    grid = results.get("attn/grid")
    if not grid:
        return {}
    rows = [
        [length, layer, head, grid["entropy"][i][j][k], grid["distance"][i][j][k]]
        for i, length in enumerate(grid["lengths"])
        for j, layer in enumerate(grid["layers"])
        for k, head in enumerate(grid["heads"])
    ]
    media: dict[str, Any] = {
        "eval/attention": wandb.Table(columns=["length", "layer", "head", "entropy", "distance"], data=rows)
    }
    plot = run_dir / "attention.png"
    if plot.is_file():
        media["eval/attention_plot"] = wandb.Image(str(plot))
    return media


def shift_media(results: dict[str, Any]) -> dict[str, Any]:
    """The shift metrics as a table: one row per offset or prefix length."""
    cells: dict[tuple[str, int], dict[str, Any]] = {}
    for key, value in results.items():
        if match := SHIFT_KEY.fullmatch(key):
            cells.setdefault((match[1], int(match[2])), {})[match[3]] = value
    if not cells:
        return {}
    rows = [[kind, k, *(m.get(name) for name in SHIFT_METRICS)] for (kind, k), m in sorted(cells.items())]
    return {"eval/shift": wandb.Table(columns=["kind", "k", *SHIFT_METRICS], data=rows)}


class WandbLogger:
    """The `Logger` protocol on one W&B run, opened here and closed by `finish`."""

    def __init__(
        self,
        cfg: LoggerConfig,
        run_config: dict[str, Any],
        run_dir: Path,
        name: str,
        group: str,
        tags: list[str],
        job_type: str,
        resume_id: str | None = None,
    ) -> None:
        """`resume_id`: the id of this job's earlier W&B run, when the job resumes from a checkpoint."""
        run_dir.mkdir(parents=True, exist_ok=True)
        self.cfg = cfg
        self.run_dir = run_dir
        self.run = wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            dir=run_dir,
            name=name,
            group=group,
            tags=list(dict.fromkeys(tags)),
            job_type=job_type,
            config=run_config,
            mode=resolve_mode(cfg.mode),  # type: ignore[arg-type]
            reinit="finish_previous",  # a job never continues the previous job's run in this process
            id=resume_id,
            resume="allow" if resume_id else None,
        )
        (run_dir / RUN_ID_FILE).write_text(self.run.id)
        self.run.define_metric(STEP, hidden=True)
        for pattern in ("train/*", "val/*", "eval/*"):
            self.run.define_metric(pattern, step_metric=STEP)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """One history row against `trainer/step` (NaN and inf are recorded as such)."""
        self.run.log({**metrics, STEP: step})

    def log_evaluation(self, results: dict[str, Any], step: int, run_dir: Path) -> None:
        """Scalars into the summary; tables and plots of the curves and grids into the history."""
        self.run.summary.update(scalars(results))
        media = {
            **perplexity_media(results),
            **position_media(results),
            **needle_media(results, run_dir),
            **shift_media(results),
            **attention_media(results, run_dir),
        }
        if media:
            self.run.log({**media, STEP: step})

    def finish(self, status: str) -> None:
        """Close the run, failed unless `status` is finished (after logging the checkpoint if asked)."""
        try:
            if status == "finished" and self.cfg.log_checkpoint:
                self.log_checkpoint()
        finally:
            self.run.finish(exit_code=0 if status == "finished" else 1)

    def log_checkpoint(self) -> None:
        """`run_dir/checkpoint.pt`, when there is one, as a model artifact of the run."""
        path = self.run_dir / "checkpoint.pt"
        if path.is_file():
            artifact = wandb.Artifact(f"model-{self.run.id}", type="model")
            artifact.add_file(str(path), policy="immutable")  # uploaded from the run dir, not copied
            self.run.log_artifact(artifact)
