"""The grammar of the evaluations' metric keys: a typed key (`MetricKey`), one `format_key`, one `parse_key`.

Every evaluator names its scalars, series and per-window arrays with these keys, and the summary, the
loggers and the report read them back through this module only. Five families:

- perplexity (`posab.evaluate.perplexity`): `METRIC[@VARIANT]/L`, e.g. `loss/512`, `ppl@yarn/4096`,
  `bpb@ntk/2048`, `position_loss@pi/4096`;
- needle (`posab.evaluate.needle`): `needle/METRIC` (over the grid), `needle/METRIC@L` (one length),
  `needle/METRIC@L/depthD` (one cell; D as Python writes the float: `depth0.25`), `needle/digit_acc/dI`
  and `needle/digit_acc@L/dI` (digit I of the key);
- shift (`posab.evaluate.shift`): `shift/{offset|prefix|context}K/METRIC`, e.g. `shift/offset512/kl`;
- task (`posab.evaluate.task`): `task/METRIC[@n]`, exact-match accuracy at an instance length n of an
  algorithmic task (`task/exact@24`; n counts the task's own unit, not tokens) and its summaries
  (`task/exact_unseen`, `task/tf_disagree`);
- audit (`posab.evaluate.extrapolation`): `audit/METRIC[@L][/layerN][/headH]`: the bias summary per head
  (`audit/bias_end/head0`; `audit/bias_jump`, the largest over heads), the MLP input novelty at each length
  (`audit/novelty_outside@4096`), the bias's pull past the training length (`audit/bias_pull@4096/head0`,
  `audit/bias_pull@4096`) and the attention statistics (`audit/entropy@4096`, the mean over layers
  and heads, and `audit/entropy@4096/layer1/head2`).

VARIANT is an evaluation-time variant of the encoding (RoPE's scalings `pi`, `ntk`, `yarn`); no variant is
the model as trained. Only the perplexity family is measured under variants today; the needle and shift
families have a place for one (`needle@yarn/acc@4096`, `shift@yarn/offset512/kl`) so that a scaled view
of the report keeps them once an evaluator measures them. Any key may start with `CORPUS:`
(`wikitext2:ppl/512`): measured on the evaluation corpus CORPUS (`eval.corpora`) instead of `eval.split`.

Keys outside the grammar (`time/...`, `params/...`, `passkey_stage/...`, `val_loss`) parse to None. A key
parses only in its one written form, so `format_key(parse_key(s)) == s` whenever `parse_key(s)` is a key.
Needs no torch.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache

from posab.content_statistics import CONTENT_METRICS

PPL, NEEDLE, SHIFT, AUDIT, TASK = "ppl", "needle", "shift", "audit", "task"  # the families
PPL_METRICS = (
    "loss",
    "ppl",
    "bpb",
    "position_loss",
    "loss_tail",
    "ppl_tail",
    "loss_capped",
    "ppl_capped",
    "loss_docmean",
    "ppl_docmean",
    "ppl_sliding",
    "ppl_windows",
)
NEEDLE_METRICS = ("acc", "logprob", "gain", "digit_acc", "attn_mass", "attn_layer", "attn_head")
NEEDLE_CELL_METRICS = ("acc", "logprob", "gain")  # the metrics with a value per (length, depth) cell
SHIFT_METRICS = ("max_abs_logit", "kl", "top1_agree", "dloss")
SHIFT_KINDS = ("offset", "prefix", "context")
AUDIT_HEAD_METRICS = ("bias_end", "bias_min_beyond", "bias_max_beyond")  # per head only
AUDIT_LENGTH_METRICS = (
    "novelty_outside",
    "novelty_outside_max",
    "novelty_nearest",
    "novelty_nearest_mean",
    "novelty_near",
)
AUDIT_ATTENTION_METRICS = ("entropy", "distance")  # at a length; per (layer, head) or their mean
# position that depends on the content (`Form.content_statistics`): at a length; per (layer, head) or mean
AUDIT_CONTENT_METRICS = CONTENT_METRICS  # declared in posab.content_statistics
AUDIT_PULL = "bias_pull"  # at a length; per head or the largest over heads
# at an instance length: exact match, the shares of each kind of wrong answer, the oracle-length reading
TASK_LENGTH_METRICS = ("exact", "stopped_early", "ran_long", "wrong_token", "oracle_exact")
TASK_SUMMARIES = ("exact_seen", "exact_unseen", "oracle_exact_seen", "oracle_exact_unseen", "tf_disagree")
TASK_METRICS = (*TASK_LENGTH_METRICS, *TASK_SUMMARIES)
AUDIT_METRICS = (
    *AUDIT_HEAD_METRICS,
    "bias_jump",
    *AUDIT_LENGTH_METRICS,
    AUDIT_PULL,
    *AUDIT_ATTENTION_METRICS,
    *AUDIT_CONTENT_METRICS,
)
FAMILY_OF = {
    metric: family
    for family, metrics in (
        (PPL, PPL_METRICS),
        (NEEDLE, NEEDLE_METRICS),
        (SHIFT, SHIFT_METRICS),
        (AUDIT, AUDIT_METRICS),
        (TASK, TASK_METRICS),
    )
    for metric in metrics
}
CORPUS_SEPARATOR = ":"  # `wikitext2:ppl/512`
NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")  # a corpus or a variant
COUNTS = ("length", "digit", "k", "layer", "head")  # the integer fields
POSITIONAL = ("length", "depth", "digit", "shift", "k", "layer", "head")  # allowed differently per family


@dataclass(frozen=True)
class MetricKey:
    """One metric key as values; `format_key` writes it, `parse_key` reads it. Invalid combinations (a
    perplexity key without a length, a depth on a shift key, ...) raise ValueError."""

    metric: str  # one of PPL_METRICS, NEEDLE_METRICS, SHIFT_METRICS
    length: int | None = None  # evaluation length L (perplexity: always; needle: @L)
    variant: str | None = None  # evaluation-time variant (`yarn`); None: the model as trained
    depth: float | None = None  # needle cell depth in [0, 1]
    digit: int | None = None  # needle/digit_acc: the key digit
    shift: str | None = None  # shift kind: offset, prefix or context
    k: int | None = None  # shift size in tokens
    corpus: str | None = None  # evaluation corpus (`eval.corpora`); None: `eval.split`
    layer: int | None = None  # audit: the attention layer
    head: int | None = None  # audit: the attention head

    def __post_init__(self) -> None:
        problem = _problem(self)
        if problem:
            raise ValueError(f"{self!r}: {problem}")

    @property
    def family(self) -> str:
        """ppl, needle, shift, audit or task: which evaluator measures the metric."""
        return FAMILY_OF[self.metric]


def _problem(key: MetricKey) -> str:
    """What makes `key` no key of the grammar, or ""."""
    if key.metric not in FAMILY_OF:
        return f"unknown metric; metrics: {', '.join(FAMILY_OF)}"
    names = [n for n in (key.variant, key.corpus) if n is not None and not NAME.fullmatch(n)]
    if names:
        return f"{names}: a variant or corpus is letters, digits, _ and -, starting with a letter"
    counts = [getattr(key, f) for f in COUNTS if getattr(key, f) is not None]
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in counts):
        return "length, digit and k are integers >= 0"
    if key.depth is not None and (isinstance(key.depth, bool) or not isinstance(key.depth, int | float)):
        return "a depth is a number"
    given = {f for f in POSITIONAL if getattr(key, f) is not None}
    required, allowed = _fields_of(key)
    if not required <= given <= allowed:
        return f"a {key.metric} key takes {sorted(allowed)}, needs {sorted(required)}; given {sorted(given)}"
    if key.shift is not None and key.shift not in SHIFT_KINDS:
        return f"shift kind {key.shift!r}; kinds: {', '.join(SHIFT_KINDS)}"
    if key.depth is not None and key.length is None:
        return "a needle depth needs a length"
    if key.layer is not None and key.head is None:
        return "an audit layer needs a head"
    return ""


def _fields_of(key: MetricKey) -> tuple[set[str], set[str]]:
    """The positional fields a key of this metric needs, and those it may have."""
    if key.family == PPL:
        return {"length"}, {"length"}
    if key.family == SHIFT:
        return {"shift", "k"}, {"shift", "k"}
    if key.family == AUDIT:
        if key.metric in AUDIT_HEAD_METRICS:
            return {"head"}, {"head"}
        if key.metric == "bias_jump":
            return set(), {"head"}
        if key.metric in AUDIT_LENGTH_METRICS:
            return {"length"}, {"length"}
        if key.metric == AUDIT_PULL:
            return {"length"}, {"length", "head"}
        return {"length"}, {"length", "layer", "head"} if key.layer is not None else {"length"}
    if key.family == TASK:
        return ({"length"}, {"length"}) if key.metric in TASK_LENGTH_METRICS else (set(), set())
    if key.metric == "digit_acc":
        return {"digit"}, {"length", "digit"}
    return set(), {"length", "depth"} if key.metric in NEEDLE_CELL_METRICS else {"length"}


def format_key(key: MetricKey) -> str:
    """The key as results.json, metrics.jsonl, W&B and runs.csv write it (module docstring)."""
    variant = f"@{key.variant}" if key.variant is not None else ""
    if key.family == PPL:
        body = f"{key.metric}{variant}/{key.length}"
    elif key.family == SHIFT:
        body = f"shift{variant}/{key.shift}{key.k}/{key.metric}"
    elif key.family == TASK:
        body = f"task{variant}/{key.metric}" + (f"@{key.length}" if key.length is not None else "")
    elif key.family == AUDIT:
        body = f"audit{variant}/{key.metric}"
        body += f"@{key.length}" if key.length is not None else ""
        body += f"/layer{key.layer}" if key.layer is not None else ""
        body += f"/head{key.head}" if key.head is not None else ""
    else:
        body = f"needle{variant}/{key.metric}"
        body += f"@{key.length}" if key.length is not None else ""
        body += f"/depth{float(key.depth)}" if key.depth is not None else ""
        body += f"/d{key.digit}" if key.digit is not None else ""
    return body if key.corpus is None else f"{key.corpus}{CORPUS_SEPARATOR}{body}"


_CORPUS = rf"(?:(?P<corpus>{NAME.pattern}){CORPUS_SEPARATOR})?"
_VARIANT = rf"(?:@(?P<variant>{NAME.pattern}))?"
GRAMMAR = (  # one pattern per family; the fields are checked by MetricKey
    re.compile(rf"{_CORPUS}(?P<metric>[a-z_]+){_VARIANT}/(?P<length>\d+)"),
    re.compile(
        rf"{_CORPUS}needle{_VARIANT}/(?P<metric>[a-z_]+)(?:@(?P<length>\d+))?"
        r"(?:/depth(?P<depth>[0-9.e+-]+)|/d(?P<digit>\d+))?"
    ),
    re.compile(rf"{_CORPUS}shift{_VARIANT}/(?P<shift>{'|'.join(SHIFT_KINDS)})(?P<k>\d+)/(?P<metric>\w+)"),
    re.compile(rf"{_CORPUS}task{_VARIANT}/(?P<metric>[a-z_]+)(?:@(?P<length>\d+))?"),
    re.compile(
        rf"{_CORPUS}audit{_VARIANT}/(?P<metric>[a-z_]+)(?:@(?P<length>\d+))?"
        r"(?:/layer(?P<layer>\d+))?(?:/head(?P<head>\d+))?"
    ),
)


@lru_cache(maxsize=65536)
def parse_key(text: str) -> MetricKey | None:
    """The key `text` names, or None when it is outside the grammar (`time/ppl@512_s`, `params/total`) or
    not in its written form (`ppl/0512`, `needle/acc@512/depth0.50`)."""
    for pattern in GRAMMAR:
        match = pattern.fullmatch(text)
        key = _from_groups(match.groupdict()) if match else None
        if key is not None and format_key(key) == text:
            return key
    return None


def _from_groups(groups: dict[str, str | None]) -> MetricKey | None:
    """The key of one pattern's match, or None when its fields make no key."""

    def number(name: str) -> int | None:
        text = groups.get(name)
        return None if text is None else int(text)

    depth = groups.get("depth")
    try:
        return MetricKey(
            metric=groups["metric"] or "",
            length=number("length"),
            variant=groups.get("variant"),
            depth=None if depth is None else float(depth),
            digit=number("digit"),
            shift=groups.get("shift"),
            k=number("k"),
            corpus=groups.get("corpus"),
            layer=number("layer"),
            head=number("head"),
        )
    except ValueError:  # a depth that is no number, or fields that make no key
        return None


def metric_key(
    metric: str,
    length: int | None = None,
    *,
    variant: str | None = None,
    depth: float | None = None,
    digit: int | None = None,
    shift: str | None = None,
    k: int | None = None,
    corpus: str | None = None,
    layer: int | None = None,
    head: int | None = None,
) -> str:
    """The written key of a metric: `metric_key("ppl", 4096, variant="yarn")` is `ppl@yarn/4096`,
    `metric_key("acc", 512, depth=0.25)` is `needle/acc@512/depth0.25`, `metric_key("kl", shift="offset",
    k=512)` is `shift/offset512/kl`, `metric_key("entropy", 4096, layer=1, head=0)` is
    `audit/entropy@4096/layer1/head0`."""
    return format_key(MetricKey(metric, length, variant, depth, digit, shift, k, corpus, layer, head))


class Metrics(Mapping[str, float]):
    """A run's scalar results, every key of the grammar parsed once, when the run is read: `by_key` holds
    them keyed by `MetricKey`, `other` the keys outside the grammar (`val_loss`, `params/total`, ...). As a
    mapping it reads by written key (`metrics["ppl/512"]`) or by MetricKey, and iterates the written keys
    in the order given; the key helpers below take its parsed keys instead of parsing again."""

    def __init__(self, values: Mapping[str, float] | None = None) -> None:
        self._values = dict(values or {})
        self.by_key: dict[MetricKey, float] = {}
        self.other: dict[str, float] = {}
        for text, value in self._values.items():
            key = parse_key(text)
            if key is None:
                self.other[text] = value
            else:
                self.by_key[key] = value

    def __getitem__(self, key: str | MetricKey) -> float:
        return self.by_key[key] if isinstance(key, MetricKey) else self._values[key]

    def __contains__(self, key: object) -> bool:
        return key in self.by_key if isinstance(key, MetricKey) else key in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __or__(self, other: Mapping[str, float]) -> Metrics:
        return Metrics({**self._values, **other})

    def __eq__(self, other: object) -> bool:
        return dict(self._values) == dict(other) if isinstance(other, Mapping) else NotImplemented

    def __repr__(self) -> str:
        return f"Metrics({self._values!r})"


def parsed(keys: Iterable[str]) -> list[MetricKey]:
    """The keys of the grammar among `keys`, parsed, in order; the others left out (`Metrics`: its keys,
    parsed when it was made)."""
    if isinstance(keys, Metrics):
        return list(keys.by_key)
    return [key for text in keys if (key := parse_key(text)) is not None]


def _where(keys: Iterable[str], metric: str, variant: str | None, corpus: str | None) -> list[MetricKey]:
    """The parsed keys of `metric` under `variant` on `corpus` (None: the plain model, `eval.split`)."""
    return [k for k in parsed(keys) if k.metric == metric and k.variant == variant and k.corpus == corpus]


def key_corpora(keys: Iterable[str], metric: str = "ppl") -> list[str]:
    """The evaluation corpora (`eval.corpora`) that `keys` hold `metric` on, by name."""
    return sorted({k.corpus for k in parsed(keys) if k.corpus is not None and k.metric == metric})


def key_lengths(
    keys: Iterable[str], metric: str, *, variant: str | None = None, corpus: str | None = None
) -> list[int]:
    """The lengths L, sorted, of the one-length keys of `metric` among `keys`: `ppl/L` for "ppl",
    `needle/acc@L` (not its cells) for "acc", `audit/entropy@L` (not per head) for "entropy"; under `variant`
    on `corpus` (None: plain, `eval.split`)."""
    found = [k for k in _where(keys, metric, variant, corpus) if k.length is not None]
    return sorted({k.length for k in found if k.depth is None and k.digit is None and k.head is None})


def shift_sizes(
    keys: Iterable[str], kind: str, metric: str, *, variant: str | None = None, corpus: str | None = None
) -> list[int]:
    """The sizes k, sorted, of the keys `shift/{kind}k/{metric}` among `keys`."""
    return sorted({k.k for k in _where(keys, metric, variant, corpus) if k.shift == kind and k.k is not None})


def needle_cells(
    keys: Iterable[str], metric: str = "acc", *, variant: str | None = None, corpus: str | None = None
) -> list[tuple[int, float]]:
    """The (length, depth) cells, sorted, of the keys `needle/{metric}@L/depthD` among `keys`."""
    found = _where(keys, metric, variant, corpus)
    return sorted({(k.length, k.depth) for k in found if k.length is not None and k.depth is not None})


def needle_digits(keys: Iterable[str], *, variant: str | None = None, corpus: str | None = None) -> list[int]:
    """The key digits I, sorted, of the keys `needle/digit_acc[@L]/dI` among `keys`."""
    return sorted({k.digit for k in _where(keys, "digit_acc", variant, corpus) if k.digit is not None})


def key_variants(keys: Iterable[str]) -> list[str]:
    """The evaluation-time variants the keys were measured under (`ppl@pi/4096` -> pi), in order of first
    appearance."""
    return list(dict.fromkeys(k.variant for k in parsed(keys) if k.variant is not None))
