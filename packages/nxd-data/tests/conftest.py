"""Shared fixtures: a small BPE tokenizer trained once per session on a few embedded-corpus documents."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nxd_data.corpus import iter_corpus
from nxd_data.train_tokenizer import train_bpe_tokenizer


@pytest.fixture(scope="session")
def corpus_docs() -> list[str]:
    docs = []
    for doc in iter_corpus():
        docs.append(doc[:3000])
        if len(docs) == 40:
            break
    return docs


@pytest.fixture(scope="session")
def tok_dir(tmp_path_factory: pytest.TempPathFactory, corpus_docs: list[str]) -> Path:
    return train_bpe_tokenizer(corpus_docs, 512, tmp_path_factory.mktemp("tok"))


def _write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture
def write_jsonl():
    """``write_jsonl(path, records)`` writes one JSON object per line and returns ``path``."""
    return _write_jsonl


def _marked_dataset(prefix: Path, num_docs: int, base: int, eos: int = 2, seed: int = 0) -> Path:
    """Documents whose tokens name them: doc ``d`` is ``[base + d] * len_d + [eos]``."""
    import numpy as np

    from nxd_data.indexed import IndexedDatasetWriter

    rng = np.random.default_rng(seed)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    writer = IndexedDatasetWriter(str(prefix) + ".bin", str(prefix) + ".idx", np.dtype(np.uint16))
    for d in range(num_docs):
        writer.add(np.array([base + d] * int(rng.integers(3, 20)) + [eos]))
    writer.finish()
    return prefix


@pytest.fixture
def marked_dataset():
    """``marked_dataset(prefix, num_docs, base)``: a dataset where every token names its document."""
    return _marked_dataset
