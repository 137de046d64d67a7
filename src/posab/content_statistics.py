"""Position that depends on the content (the extrapolation audit's part 4), declared once: each kind's
statistics (what its attention form's `content_statistics` reports; the metric keys' grammar takes its
names from here, `posab.keys.AUDIT_CONTENT_METRICS`) and the report's table of them (its columns and their
legend, `posab.report.content_audit`). A new content statistic is one line here and the form that computes
it. Imports nothing of posab, so that the keys' grammar can build on it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ContentColumn:
    """One number of a run in the report: `statistic` at T or at L (`at_train`), its mean over layers and
    heads or its largest head (`largest_head`)."""

    statistic: str
    at_train: bool
    fmt: str
    largest_head: bool = False

    def header(self, train_len: int, longest: int) -> str:
        length = train_len if self.at_train else longest
        return f"{self.statistic}@{length}" + (" (largest head)" if self.largest_head else "")


@dataclass(frozen=True)
class ContentTable:
    """One kind of content-dependent position: the statistics its form reports, one report table."""

    title: str
    statistics: tuple[str, ...]
    columns: tuple[ContentColumn, ...]
    legend: tuple[str, ...]


CONTENT_TABLES = (
    ContentTable(
        "forget gates (FoX)",
        ("gate_log", "gate_bias_far"),
        (
            ContentColumn("gate_log", True, ".3f"),
            ContentColumn("gate_log", False, ".3f"),
            ContentColumn("gate_log", False, ".4f", largest_head=True),
            ContentColumn("gate_bias_far", False, ".0f"),
        ),
        (
            "gate_log@N: the mean log forget gate per token at length N, mean over layers and heads "
            "(`audit/gate_log@N`): the slope of the decay D_ij = c_i − c_j; a head at g reaches about "
            "1/|g| tokens before its bias falls by 1 nat",
            "gate_log (largest head): the slowest-decaying head's (layer, head): the model's longest reach",
            "gate_bias_far@L: the mean gate bias at the window's longest distance L − 1 "
            "(`audit/gate_bias_far@L`)",
        ),
    ),
    ContentTable(
        "Householder transforms (PaTH)",
        ("path_beta", "path_kept_far", "path_turn_far"),
        (
            ContentColumn("path_beta", True, ".3f"),
            ContentColumn("path_kept_far", True, ".3f"),
            ContentColumn("path_kept_far", False, ".3f"),
            ContentColumn("path_kept_far", False, ".3f", largest_head=True),
            ContentColumn("path_turn_far", False, ".3f"),
        ),
        (
            "path_beta@T: the mean strength beta of the transforms H_s = I − beta_s w_s w_s^T, in (0, 2), "
            "mean over layers and heads (`audit/path_beta@T`)",
            "path_kept_far@N: the share |H_{N−1} ... H_{j+1} k_j| / |k_j| of the norm of the window's first "
            "16 keys that reaches its last query (`audit/path_kept_far@N`): how far the transforms carry a "
            "key; (largest head): the head that carries keys farthest",
            "path_turn_far@L: the cosine between those keys and themselves carried to the last query (1: not "
            "turned)",
        ),
    ),
    ContentTable(
        "position counts (CoPE)",
        ("cope_count_last", "cope_count_mean", "cope_count_max", "cope_clamped", "cope_past_trained"),
        (
            ContentColumn("cope_count_max", True, ".0f"),
            ContentColumn("cope_count_max", False, ".0f"),
            ContentColumn("cope_count_last", False, ".0f"),
            ContentColumn("cope_clamped", False, ".3f"),
            ContentColumn("cope_past_trained", False, ".3f"),
            ContentColumn("cope_past_trained", False, ".3f", largest_head=True),
        ),
        (
            "cope_count_max@N: the largest position count of a window of N, mean over layers and heads "
            "(`audit/cope_count_max@N`); cope_count_last@L: the count at the last query, mean over its keys",
            "cope_clamped@L: the share of pairs counted past npos − 1, which read the last table row "
            "(`audit/cope_clamped@L`)",
            "cope_past_trained@L: the share of pairs counted past each head's largest count at T: keys that "
            "read a table row training barely reached, mean over heads and for the largest head",
        ),
    ),
)
CONTENT_METRICS = tuple(name for table in CONTENT_TABLES for name in table.statistics)
