"""Section 2: the training step of every encoding (`Trainer.step`), timed interleaved; ratio to NoPE."""

from __future__ import annotations

from posab.bench.inputs import posab_model
from posab.bench.measure import median_times
from posab.bench.output import Result
from posab.bench.progress import Progress
from posab.bench.settings import Settings
from posab.bench.steps import training_step


def section(settings: Settings, progress: Progress) -> Result:
    result = Result("section2_train_step", "2. Training step time for every encoding")
    configs = {name: settings.config(name) for name in progress.over(settings.encoding_names(), "section 2")}
    steps = [training_step(posab_model(cfg), cfg) for cfg in configs.values()]
    progress.note(f"{len(configs)} encodings, interleaved")
    times = dict(zip(configs, median_times(steps, settings.warmup, settings.repeats), strict=True))
    for name, cfg in configs.items():
        tokens = cfg.train.batch_size * cfg.train.seq_len
        result.rows.append(
            {
                "encoding": name,
                "length": cfg.train.seq_len,
                "batch": cfg.train.batch_size,
                "step_s": times[name],
                "tokens_per_s": tokens / times[name],
                "ratio_to_nope": times[name] / times["nope"],
            }
        )
    return result
