"""Weights & Biases logging: one W&B run per job, offline unless an API key is configured.

History: `train/*`, `val/*` and the evaluation media (`eval/*`) against `trainer/step`. Evaluation
scalars (`ppl/4096`, `needle/acc`, `shift/offset512/kl`, ...) go into the run's summary, so that they are
columns of the runs table; the tables, curves and figures the evaluators return are logged as W&B tables,
line plots and images, whatever they are (the logger knows no evaluator). The files of a run are written under
the job's run directory (`RUN_DIR/wandb/offline-run-*` offline; `wandb sync` uploads them later).
"""

from __future__ import annotations

import io
import netrc
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import PIL.Image
import wandb

from posab.logging import LoggerConfig
from posab.outputs import EvalOutput
from posab.plots import png_bytes

STEP = "trainer/step"
RUN_ID_FILE = "wandb_run_id.txt"  # in the run directory: a resumed job continues this W&B run
DEFAULT_HOST = "https://api.wandb.ai"


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


def media(output: EvalOutput) -> dict[str, Any]:
    """W&B objects for an evaluation's tables, curves and figures, keyed `eval/<name>`."""
    logged: dict[str, Any] = {}
    for name, table in output.tables.items():
        logged[f"eval/{name}"] = wandb.Table(columns=table.columns, data=table.rows)
    for name, curves in output.curves.items():
        xs, ys = zip(*curves.series.values(), strict=True) if curves.series else ((), ())
        logged[f"eval/{name}"] = wandb.plot.line_series(
            xs=list(xs), ys=list(ys), keys=list(curves.series), title=curves.title, xname=curves.xname
        )
    for name, figure in output.figures.items():
        logged[f"eval/{name}"] = wandb.Image(PIL.Image.open(io.BytesIO(png_bytes(figure))))
    return logged


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

    def log_evaluation(self, output: EvalOutput, step: int) -> None:
        """Scalars into the summary (columns of the runs table); tables, curves and figures into the
        history."""
        self.run.summary.update(output.scalars)
        logged = media(output)
        if logged:
            self.run.log({**logged, STEP: step})

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
