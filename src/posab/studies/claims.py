"""Claims: the comparisons a study's reading rests on, each stated once, in a declared family, with the
direction it expects and the commit it was written at.

Holm's correction over every row compared with a reference asks more of each comparison than the few a
reading needs, and a family made of whatever rows share a report folder gives one comparison a different
p in every folder. So a claim's family is declared, once: a claims file (`results/study/claims/*.csv`, one
per study part) lists each claim, and `claim_verdicts` tests each family over the whole study's runs
(adjusted within it by its declared procedure; Bender & Lange 2001 on a confirmatory family of stated
hypotheses). Every report that holds a claimed comparison shows that verdict (`posab report --claims`);
every other comparison is exploratory and never `ordered`.

Columns: `family`; `row` and `reference`, selectors `key=value; key=value` over a run's `encoding`,
`experiment`, `precision`, `seed` and config keys (`encoding.clamp=train`), which pick the study's finished
runs that match every pair, and `scaling` (`scaling=yarn`: those runs read with RoPE's YaRN at evaluation,
their `@yarn` keys, the same weights); `metric` (loss, loss_tail), `length`, `corpus` (empty: `eval.split`);
`direction` (`less`: the row's loss is lower than the reference's; `greater`); `status` (`preregistered`:
written before the runs that test it, as `registered` says; `post-hoc`: chosen after seeing them, whose
verdict is at most `suggestive`); `registered` (the commit the claim was written at, first, then when and
what had run); `statement` (the sentence the claim makes, as the readings quote it). Two optional columns,
one value per family (written on each of its lines): `procedure`, how the family's ps are adjusted (`holm`,
the default when empty or absent: Holm's 1979 step-down; `fixed-sequence`: the claims tested in their file
order, each at α, until the first whose p is not below α, the i-th's adjusted p the largest p of the
first i, Maurer et al. 1995), and `seeds`, the seed pairs the family plans (a positive integer; empty:
not declared, as in the families written before it). `posab claims plan FILE` says, before any run,
whether a family can reach α at those seeds (`posab.studies.power`), and `posab claims` refuses a
preregistered family that cannot.

A claim's p is one-sided, in its stated direction: the direction was fixed before the runs, so a two-sided
test would spend half its level on an outcome nobody claimed. Exploratory comparisons are two-sided.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from posab.report.grouping import PRECISION, Row
from posab.report.records import ReportError, RunRecord
from posab.report.resampling import fixed_sequence, holm, least_fixed_sequence_p, least_holm_p
from posab.report.scaling import scaled_view, scaling_kinds

REQUIRED = (
    "family",
    "row",
    "reference",
    "metric",
    "length",
    "direction",
    "status",
    "registered",
    "statement",
)
OPTIONAL = ("corpus", "procedure", "seeds")
DIRECTIONS = ("less", "greater")
PREREGISTERED, POST_HOC = "preregistered", "post-hoc"
STATUSES = (PREREGISTERED, POST_HOC)
HOLM, FIXED_SEQUENCE = "holm", "fixed-sequence"
PROCEDURES = (HOLM, FIXED_SEQUENCE)  # a family's adjustment; HOLM where a file does not say
Adjustment = Callable[[Sequence[float]], list[float]]
ADJUSTMENTS: dict[str, Adjustment] = {HOLM: holm, FIXED_SEQUENCE: fixed_sequence}
# the least adjusted p a family can reach from its claims' least one-sided ps, in file order
LEAST_ADJUSTED: dict[str, Callable[[Sequence[float]], float]] = {
    HOLM: least_holm_p,
    FIXED_SEQUENCE: least_fixed_sequence_p,
}
FAMILY_FIELDS = ("procedure", "seeds")  # written on each line of a family, one value per family
INFO_FIELDS = ("experiment", PRECISION)  # selector keys read from a run's info, not its config
SCALING = "scaling"  # the selector key that reads runs under an evaluation-time scaling (`scaling=yarn`)
VERDICTS_FILE = "verdicts.csv"  # what `posab claims` writes beside the claims files


@dataclass(frozen=True)
class Selector:
    """`key=value` pairs a run must all match: its encoding, seed, experiment, precision or config keys."""

    pairs: tuple[tuple[str, str], ...]

    @classmethod
    def parse(cls, text: str, where: str) -> Selector:
        items = [item.strip() for item in text.split(";") if item.strip()]
        bad = [item for item in items if "=" not in item]
        if not items or bad:
            raise ReportError(
                f"{where}: selector {text!r} is not `key=value; key=value` (e.g. encoding=alibi)"
            )
        return cls(tuple(tuple(part.strip() for part in item.split("=", 1)) for item in items))  # type: ignore[misc]

    def matches(self, run: RunRecord) -> bool:
        """Whether the run matches every pair (`scaling` picks a view of the run, not the run)."""
        return all(_value(run, key) == value for key, value in self.pairs if key != SCALING)

    @property
    def scaling(self) -> str:
        """The evaluation-time RoPE scaling the selector reads its runs with (`scaling=yarn`: the runs'
        `@yarn` keys, `posab.report.scaling.scaled_view`), "" for their own numbers."""
        return next((value for key, value in self.pairs if key == SCALING), "")

    def __str__(self) -> str:
        return "; ".join(f"{k}={v}" for k, v in self.pairs)


def _value(run: RunRecord, key: str) -> str:
    if key == "encoding":
        return run.encoding
    if key == "seed":
        return "" if run.seed is None else str(run.seed)
    if key in INFO_FIELDS:
        return run.info.get(key, "")
    return run.config.get(key, "")


@dataclass(frozen=True)
class Claim:
    """One stated comparison: `row` against `reference` in `metric` at `length` on `corpus`."""

    id: str  # FAMILY.N: the N-th claim of its family in its file
    family: str
    row: Selector
    reference: Selector
    metric: str
    length: int
    corpus: str
    direction: str
    status: str
    registered: str
    statement: str
    procedure: str = HOLM  # PROCEDURES: how the family's ps are adjusted
    seeds: int | None = None  # the seed pairs the family plans; None: not declared


def claims_file_lines(
    path: Path, kind: str, required: Sequence[str], optional: Sequence[str] = ()
) -> list[tuple[int, dict[str, str]]]:
    """(line number, {column: text}) for each claim line of a CSV file (the header is line 1); an unreadable
    file or a missing required column is an error naming the file and the columns it may have."""
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, ValueError) as err:
        raise ReportError(f"{kind} {path}: unreadable ({err})") from err
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise ReportError(f"{kind} {path}: no column {missing}; columns: {', '.join([*required, *optional])}")
    return list(enumerate(frame.to_dict("records"), start=2))


def read_claims(path: Path, metrics: Sequence[str]) -> list[Claim]:
    """The claims of one CSV file; an unreadable file, a missing column, or a value out of its set is an
    error naming the line and what would be valid."""
    counts: dict[str, int] = {}
    claims, numbers = [], []
    for number, line in claims_file_lines(path, "claims file", REQUIRED, OPTIONAL):
        counts[line["family"]] = counts.get(line["family"], 0) + 1
        claims.append(_claim(f"claims file {path}, line {number}", line, counts[line["family"]], metrics))
        numbers.append(number)
    _check_family_fields(path, claims, numbers)
    return claims


def _check_family_fields(path: Path, claims: Sequence[Claim], numbers: Sequence[int]) -> None:
    """A FAMILY_FIELDS column that takes two values within one family is an error naming the family and
    the lines of each value (an empty `procedure` is `holm`)."""
    found: dict[tuple[str, str], dict[str, list[str]]] = {}  # (family, column) -> value -> line numbers
    for claim, number in zip(claims, numbers, strict=True):
        for column in FAMILY_FIELDS:
            value = getattr(claim, column)
            lines = found.setdefault((claim.family, column), {})
            lines.setdefault("" if value is None else str(value), []).append(str(number))
    for (family, column), lines in found.items():
        if len(lines) > 1:
            values = "; ".join(f"{value!r} on line(s) {', '.join(at)}" for value, at in lines.items())
            raise ReportError(
                f"claims file {path}: family {family!r} has two values of `{column}` ({values}); a family "
                "has one: write the same on each of its lines"
            )


def _claim(where: str, line: dict[str, str], index: int, metrics: Sequence[str]) -> Claim:
    checks = {"metric": metrics, "direction": DIRECTIONS, "status": STATUSES}
    for column, valid in checks.items():
        if line[column] not in valid:
            raise ReportError(f"{where}: {column} {line[column]!r}; valid: {', '.join(valid)}")
    if not line["length"].isdigit() or int(line["length"]) == 0:
        raise ReportError(f"{where}: length {line['length']!r} is not a positive integer (e.g. 512)")
    if not line["family"] or not line["registered"]:
        raise ReportError(f"{where}: a claim needs its family and where it was registered (`registered`)")
    return Claim(
        f"{line['family']}.{index}",
        line["family"],
        Selector.parse(line["row"], where),
        Selector.parse(line["reference"], where),
        line["metric"],
        int(line["length"]),
        line.get("corpus", ""),
        line["direction"],
        line["status"],
        line["registered"],
        line["statement"],
        _procedure(where, line.get("procedure", "")),
        _seeds(where, line.get("seeds", "")),
    )


def _procedure(where: str, text: str) -> str:
    """A line's `procedure`: HOLM when empty, else one of PROCEDURES (an error naming them)."""
    if text and text not in PROCEDURES:
        raise ReportError(f"{where}: procedure {text!r}; valid: {', '.join(PROCEDURES)} (empty: {HOLM})")
    return text or HOLM


def _seeds(where: str, text: str) -> int | None:
    """A line's `seeds`: None when empty, else a positive integer (an error otherwise)."""
    if not text:
        return None
    if not text.isdigit() or int(text) == 0:
        raise ReportError(f"{where}: seeds {text!r} is not a positive integer (seed pairs planned, e.g. 8)")
    return int(text)


def read_claims_dir(folder: Path, metrics: Sequence[str]) -> list[Claim]:
    """Every claims file of a study (`*.csv` but VERDICTS_FILE), in name order; a family declared in two
    files is an error (a family is declared once)."""
    files = sorted(p for p in folder.glob("*.csv") if p.name != VERDICTS_FILE)
    if not files:
        raise ReportError(f"no claims file (*.csv) in {folder}")
    return read_claims_files(files, metrics)


def read_claims_files(files: Sequence[Path], metrics: Sequence[str]) -> list[Claim]:
    """The claims of these files, in their order; a family declared in two files is an error."""
    claims: list[Claim] = []
    owner: dict[str, Path] = {}
    for path in files:
        for claim in read_claims(path, metrics):
            if owner.setdefault(claim.family, path) != path:
                raise ReportError(
                    f"family {claim.family!r} is declared in {owner[claim.family]} and in {path}"
                )
            claims.append(claim)
    return claims


def describe(claim: Claim) -> str:
    """`[row] vs [reference], metric/length` (on CORPUS)."""
    text = f"`{claim.row}` vs `{claim.reference}`, {claim.metric}/{claim.length}"
    return text + (f" on {claim.corpus}" if claim.corpus else "")


def claim_rows(claim: Claim, pool: Sequence[RunRecord]) -> tuple[Row, Row]:
    """The claim's two rows from a study's finished runs: those each selector matches, one run per seed; a
    selector that matches none, or two runs of one seed, is an error naming the claim."""
    rows = []
    for selector in (claim.row, claim.reference):
        runs = [r for r in pool if r.finished and selector.matches(r)]
        seeds = [r.seed for r in runs]
        twice = sorted({s for s in seeds if seeds.count(s) > 1}, key=str)
        if not runs or twice:
            problem = "matches no finished run" if not runs else f"matches two runs of seed(s) {twice}"
            raise ReportError(f"claim {claim.id} ({describe(claim)}): `{selector}` {problem}")
        runs = [viewed(run, selector.scaling, claim) for run in sorted(runs, key=lambda r: (r.seed, r.name))]
        rows.append(Row(runs[0].study, str(selector), runs[0].encoding, selector.scaling, runs))
    return rows[0], rows[1]


def viewed(run: RunRecord, scaling: str, claim: Claim) -> RunRecord:
    """The run as the claim reads it: its own numbers, or its view under an evaluation-time scaling it was
    evaluated with (the same weights: RoPE read with YaRN is a same-weights row of RoPE); a scaling the run
    lacks is an error naming the claim and the scalings it has."""
    if not scaling:
        return run
    kinds = scaling_kinds(run)
    if scaling not in kinds:
        raise ReportError(
            f"claim {claim.id} ({describe(claim)}): run {run.name} was not evaluated with scaling "
            f"{scaling!r}; it has {', '.join(kinds) or 'none'}"
        )
    return scaled_view(run, scaling)


def family_adjusted(frame: pd.DataFrame) -> pd.Series:
    """Each claim's one-sided p adjusted within its family by the family's procedure (`p_claim` and
    `procedure` -> `p_holm`): Holm's step-down, or the fixed sequence over the claims in file order (the
    frame's order)."""
    adjusted = pd.Series(float("nan"), index=frame.index)
    for _, index in frame.groupby("family", sort=False).groups.items():
        procedure = frame.loc[index, "procedure"].iloc[0]
        adjusted.loc[index] = ADJUSTMENTS[procedure](frame.loc[index, "p_claim"].tolist())
    return adjusted
