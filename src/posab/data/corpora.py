"""Corpora: documents per split (train / valid / test), loaded through `datasets` where text is real.

- synthetic: the embedded generator (`posab.data.synthetic`), no download.
- text: local `.txt` documents. A folder with `train/`, `valid/` (or `validation/`) and optionally `test/`
  sub-folders is used as split; any other folder, file or glob is split by document (or, with fewer than
  three documents, by paragraph: 90 / 5 / 5 of the text).
- hub: a Hugging Face dataset (`Salesforce/wikitext` for `data=wikitext103`), or an offline copy of it
  in `hub_local_dir` (parquet or text files named by split).
"""

from __future__ import annotations

import codecs
import glob
import hashlib
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from posab.data.config import DataConfig
from posab.data.synthetic import SyntheticSpec, generate_corpus
from posab.distributed import progress_bar
from posab.errors import ConfigError

SPLITS = ("train", "valid", "test")
SPLIT_ALIASES = {"train": "train", "valid": "valid", "validation": "valid", "val": "valid", "test": "test"}
UNSPLIT = "unsplit"  # documents not yet split (`all` is reserved by `datasets`)
WIKITEXT_TITLE = re.compile(r"^ = [^=].* = $")
HASH_CHUNK = 1 << 24  # bytes read at a time while hashing a corpus file


def corpus_identity(cfg: DataConfig) -> dict[str, Any]:
    """A cheap description of the corpus contents, for the token cache key."""
    if cfg.source == "synthetic":
        return {"source": "synthetic", **asdict(cfg.synthetic)}
    if cfg.source == "text":
        return {"source": "text", "files": _fingerprint(_split_files(cfg), cfg.progress)}
    local = _local_hub_files(cfg) if cfg.hub_local_dir else {}
    return {
        "source": "hub",
        "dataset": cfg.hub_dataset,
        "subset": cfg.hub_subset,
        "field": cfg.text_field,
        "local": _fingerprint(local, cfg.progress),
    }


def load_documents(cfg: DataConfig) -> dict[str, list[str]]:
    """Documents of each split."""
    if cfg.source == "synthetic":
        s = cfg.synthetic
        spec = SyntheticSpec(
            seed=s.seed,
            vocab_size=s.vocab_size,
            train_docs=s.train_docs,
            valid_docs=s.valid_docs,
            test_docs=s.test_docs,
        )
        return generate_corpus(spec)
    if cfg.source == "text":
        return _load_text(cfg)
    return _load_hub(cfg)


# ---------------------------------------------------------------- local text


def load_eval_documents(path: str, fmt: str, where: str) -> list[str]:
    """The documents of an evaluation corpus (`eval.corpora`), in file order then document order.

    text: every .txt/.raw/.md file of a folder, file or glob is one document. wikitext: the files' lines
    regrouped into articles, each starting at a top-level ` = Title = ` line (WikiText's own layout).
    `where` names the config entry in errors."""
    files = _text_files(path) if Path(path).expanduser().exists() or glob.glob(path) else []
    if not files:
        raise ConfigError(f"{where}.path='{path}' does not exist (give a folder, a text file or a glob)")
    for file in files:
        _check_text_file(file)
    texts = [file.read_text(encoding="utf-8") for file in files]
    if fmt == "wikitext":
        docs = group_wikitext([line for text in texts for line in text.splitlines(keepends=True)])
    else:
        docs = [text for text in texts if text.strip()]
    if not docs:
        raise ConfigError(f"{where}.path='{path}' holds no text")
    return docs


def _text_files(path: str) -> list[Path]:
    """Every .txt file a path, folder or glob names, sorted."""
    root = Path(path).expanduser()
    if root.is_dir():
        return sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".txt", ".raw", ".md"))
    if root.is_file():
        return [root]
    matches = sorted(Path(p) for p in glob.glob(str(root), recursive=True) if Path(p).is_file())
    if not matches:
        raise ConfigError(f"data.path='{path}' does not exist (give a folder, a text file or a glob)")
    return matches


def _split_files(cfg: DataConfig) -> dict[str, list[Path]]:
    """Files per split when the folder has split sub-folders, else {UNSPLIT: files}."""
    if not cfg.path:
        raise ConfigError("data.path is not set: data=text needs data.path=FOLDER_OR_FILES")
    root = Path(cfg.path).expanduser()
    children = list(root.iterdir()) if root.is_dir() else []
    sub = {SPLIT_ALIASES[p.name]: p for p in children if p.is_dir() and p.name in SPLIT_ALIASES}
    if "train" in sub:
        if "valid" not in sub:
            raise ConfigError(
                f"data.path='{cfg.path}' has a train/ folder but no valid/ (or validation/) folder"
            )
        files = {split: _text_files(str(folder)) for split, folder in sub.items()}
    else:
        files = {UNSPLIT: _text_files(cfg.path)}
    if not any(files.values()):
        raise ConfigError(f"data.path='{cfg.path}' holds no text files (.txt, .raw or .md)")
    return files


def _fingerprint(files: dict[str, list[Path]], progress: bool) -> dict[str, list[list[str]]]:
    """[name, sha1] of every file, by split; a progress bar counts the bytes hashed (`data.progress`)."""
    size = sum(p.stat().st_size for paths in files.values() for p in paths)
    show = progress and size > 0
    with progress_bar(None, "hashing corpus", show, total=size, unit="B", unit_scale=True) as bar:
        return {split: [[p.name, _sha1(p, bar)] for p in paths] for split, paths in sorted(files.items())}


def _sha1(path: Path, bar: tqdm) -> str:
    """The file's sha1, read in chunks, each counted on `bar`."""
    digest = hashlib.sha1()
    with path.open("rb") as f:
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def _load_text(cfg: DataConfig) -> dict[str, list[str]]:
    import datasets

    files = _split_files(cfg)
    for paths in files.values():
        for p in paths:
            _check_text_file(p)
    if all(p.stat().st_size == 0 for paths in files.values() for p in paths):
        raise ConfigError(f"data.path='{cfg.path}' holds only empty files")
    data_files = {split: [str(p) for p in paths] for split, paths in files.items() if paths}
    loaded = datasets.load_dataset(
        "text", data_files=data_files, sample_by="document", keep_linebreaks=True, cache_dir=_hf_cache(cfg)
    )
    docs = {split: [row["text"] for row in loaded[split] if row["text"].strip()] for split in data_files}
    if UNSPLIT in docs:
        docs = split_documents(docs[UNSPLIT])
    docs.setdefault("test", [])
    _check_not_empty(docs, cfg.path or "")
    return docs


def _check_text_file(path: Path) -> None:
    """Reject binary or non-UTF-8 files by their first 64 KiB (a character cut at the sample end is fine)."""
    head = path.read_bytes()[:65536]
    whole = path.stat().st_size <= len(head)
    try:
        if b"\x00" in head:
            raise UnicodeDecodeError("utf-8", head, head.index(b"\x00"), len(head), "NUL byte")
        codecs.getincrementaldecoder("utf-8")().decode(head, final=whole)
    except UnicodeDecodeError:
        raise ConfigError(f"data.path file '{path}' is not UTF-8 text (binary data?)") from None


def split_documents(docs: list[str]) -> dict[str, list[str]]:
    """Split unsplit documents: by document when there are at least three, else by paragraph 90/5/5."""
    if len(docs) >= 3:
        held_out = max(1, len(docs) // 20)
        return {
            "train": docs[: -2 * held_out],
            "valid": docs[-2 * held_out : -held_out],
            "test": docs[-held_out:],
        }
    paragraphs = [p for doc in docs for p in re.split(r"\n[ \t\r]*\n", doc) if p.strip()]
    if len(paragraphs) < 3:
        return {"train": docs, "valid": [], "test": []}
    ends = np.cumsum([len(p) for p in paragraphs])  # characters up to and including each paragraph
    n = len(paragraphs)
    a = int(np.clip(np.searchsorted(ends, 0.90 * ends[-1]) + 1, 1, n - 2))
    b = int(np.clip(np.searchsorted(ends, 0.95 * ends[-1]) + 1, a + 1, n - 1))
    join = "\n\n".join
    return {"train": [join(paragraphs[:a])], "valid": [join(paragraphs[a:b])], "test": [join(paragraphs[b:])]}


def _check_not_empty(docs: dict[str, list[str]], where: str) -> None:
    for split in ("train", "valid"):
        if not docs.get(split):
            raise ConfigError(f"data at '{where}' gives no {split} text (the {split} split is empty)")


# ---------------------------------------------------------------- hugging face hub


def _hf_cache(cfg: DataConfig) -> str:
    return str(Path(cfg.cache_dir).expanduser() / "hf")


def _local_hub_files(cfg: DataConfig) -> dict[str, list[Path]]:
    """Files of an offline hub copy, by split, from their names (train-*.parquet, validation-*, ...)."""
    root = Path(cfg.hub_local_dir or "").expanduser()
    if not root.is_dir():
        raise ConfigError(f"data.hub_local_dir='{cfg.hub_local_dir}' is not a folder")
    files: dict[str, list[Path]] = {}
    for p in sorted(root.rglob("*")):
        if not p.is_file() or p.suffix not in (".parquet", ".txt", ".raw"):
            continue
        name = p.name.lower().replace("wiki.", "")
        split = next((SPLIT_ALIASES[a] for a in SPLIT_ALIASES if name.startswith(a)), None)
        if split:
            files.setdefault(split, []).append(p)
    if "train" not in files or "valid" not in files:
        raise ConfigError(
            f"data.hub_local_dir='{cfg.hub_local_dir}' needs train* and validation* (or valid*) files, "
            f"found splits {sorted(files) or 'none'}"
        )
    return files


def _load_hub(cfg: DataConfig) -> dict[str, list[str]]:
    import datasets

    if cfg.hub_local_dir:
        files = _local_hub_files(cfg)
        builder = "parquet" if all(p.suffix == ".parquet" for ps in files.values() for p in ps) else "text"
        data_files = {split: [str(p) for p in paths] for split, paths in files.items()}
        loaded = datasets.load_dataset(builder, data_files=data_files, cache_dir=_hf_cache(cfg))
    else:
        if not cfg.hub_dataset:
            raise ConfigError("data.hub_dataset is not set (e.g. Salesforce/wikitext)")
        loaded = datasets.load_dataset(cfg.hub_dataset, cfg.hub_subset, cache_dir=_hf_cache(cfg))
    docs: dict[str, list[str]] = {}
    for name in loaded:
        split = SPLIT_ALIASES.get(name)
        if split is None:
            continue
        if cfg.text_field not in loaded[name].column_names:
            raise ConfigError(
                f"data.text_field='{cfg.text_field}' is not a column; columns: {loaded[name].column_names}"
            )
        rows = loaded[name][cfg.text_field]
        docs[split] = group_wikitext(rows) if _is_line_per_row(rows) else [r for r in rows if r.strip()]
    docs.setdefault("test", [])
    _check_not_empty(docs, cfg.hub_local_dir or f"{cfg.hub_dataset}/{cfg.hub_subset}")
    return docs


def _is_line_per_row(rows: list[str]) -> bool:
    """WikiText keeps one line per row, with ` = Title = ` lines starting articles."""
    sample = rows[:2000]
    return any(WIKITEXT_TITLE.match(r.rstrip("\n")) for r in sample)


def group_wikitext(lines: list[str]) -> list[str]:
    """Rejoin WikiText lines into articles, each starting at a top-level ` = Title = ` line."""
    articles: list[list[str]] = []
    for line in lines:
        if WIKITEXT_TITLE.match(line.rstrip("\n")) or not articles:
            articles.append([])
        articles[-1].append(line if line.endswith("\n") else line + "\n")
    texts = ["".join(a).strip("\n") + "\n" for a in articles]
    return [t for t in texts if t.strip()]
