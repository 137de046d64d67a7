"""The forest plots of the claims families (`posab.studies.forest`): one PNG per family of the committed
verdicts, and the helpers that decide each claim's shaded side and its texts."""

from __future__ import annotations

import struct
from pathlib import Path

import pandas as pd
import pytest

from conftest import ROOT
from posab.studies.forest import (
    claim_label,
    claim_limits,
    claimed_span,
    comparison_label,
    verdict_label,
    write_forest_plots,
)

VERDICTS = ROOT / "results" / "study" / "claims" / "verdicts.csv"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_every_family_of_the_committed_verdicts_gets_a_readable_png(tmp_path: Path) -> None:
    verdicts = pd.read_csv(VERDICTS)
    written = write_forest_plots(verdicts, tmp_path)
    families = list(dict.fromkeys(verdicts["family"]))
    assert [p.name for p in written] == [f"forest_{f}.png" for f in families]
    for path, family in zip(written, families, strict=True):
        data = path.read_bytes()
        assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
        width, height = struct.unpack(">II", data[16:24])  # the PNG's header chunk: its size in pixels
        claims = int((verdicts["family"] == family).sum())
        assert 800 <= width <= 1600, (path.name, width)
        assert 60 * claims + 150 <= height <= 150 * claims + 300, (path.name, height, claims)


def test_the_claimed_side_is_shaded() -> None:
    limits = claim_limits(-1.2, -1.34, -1.04)
    assert limits[0] < -1.34 and limits[1] > 0.0  # the interval and 0 both in range
    assert claimed_span("less", limits) == (limits[0], 0.0)
    assert claimed_span("greater", limits) == (0.0, limits[1])
    with pytest.raises(ValueError, match="direction"):
        claimed_span("two-sided", limits)
    assert claim_limits(0.0, 0.0, 0.0) == (-1e-3, 1e-3)


def line(**changes: object) -> dict[str, object]:
    """A verdicts.csv line (part10.1's), with `changes`."""
    base = {
        "claim": "part10.1",
        "row": "encoding=fox; experiment=study_frontier",
        "reference": "encoding=rope; experiment=study_frontier",
        "metric": "loss",
        "length": 4096,
        "corpus": float("nan"),
        "difference": -1.1867,
        "low": -1.3398,
        "high": -1.0417,
        "p_holm": 0.21875,
        "verdict": "suggestive",
    }
    return base | changes


def test_the_texts_name_the_comparison_the_verdict_and_the_procedure() -> None:
    assert verdict_label(line()) == "suggestive · Holm p 0.219 (α 0.05)\nΔ −1.187 [−1.340, −1.042]"
    fixed = verdict_label(line(procedure="fixed-sequence", p_holm=0.03125, verdict="ordered"))
    assert fixed.startswith("ordered · fixed-sequence p 0.031 (α 0.05)")
    assert claim_label(line()) == "part10.1: FoX vs RoPE\nloss/4096"
    assert claim_label(line(corpus="wikitext2")).endswith("loss/4096 on wikitext2")
    clamp = comparison_label(
        "encoding=multiscale; precision=fp32; encoding.clamp=train",
        "encoding=multiscale; precision=fp32; encoding.clamp=null",
    )
    assert clamp == "multi-scale (clamp=train) vs multi-scale (clamp=null)"
    assert comparison_label("encoding=dape_alibi", "encoding=alibi; precision=fp32") == (
        "DAPE-ALiBi vs ALiBi (precision=fp32)"
    )
