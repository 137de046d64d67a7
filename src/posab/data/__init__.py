"""Data: corpora, the byte or BPE tokenizer with anchors, cached token streams and batches.

- `config`: the data settings (`data.*`); `corpora`: the documents of a corpus and of an evaluation corpus;
- `tokenizer` (bytes, the sentence and paragraph rule, anchors), `bpe`, `structure` (the same rule one
  token at a time, for decoding);
- `streams`: token streams, their cache and windows; `pipeline`: the corpus tokenized once and cached, a
  run's tokenizer, the evaluation corpora; `sampler`: training batches; `synthetic`, `tasks`: generated
  corpora and the algorithmic tasks.
"""

from posab.data.config import DataConfig, SyntheticConfig, TaskConfig
from posab.data.pipeline import (
    CorpusData,
    eval_corpus_stream,
    prepare_data,
    run_tokenizer,
    save_run_tokenizer,
    token_cache_folder,
    tokenizer_settings,
)
from posab.data.sampler import ExampleMix, TrainSampler
from posab.data.streams import Batch, TokenStream

__all__ = [
    "Batch",
    "CorpusData",
    "DataConfig",
    "ExampleMix",
    "SyntheticConfig",
    "TaskConfig",
    "TokenStream",
    "TrainSampler",
    "eval_corpus_stream",
    "prepare_data",
    "run_tokenizer",
    "save_run_tokenizer",
    "token_cache_folder",
    "tokenizer_settings",
]
