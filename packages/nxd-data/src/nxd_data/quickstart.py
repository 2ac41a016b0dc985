"""Quickstart data: a BPE tokenizer trained on the embedded corpus and its indexed dataset.

``prepare_quickstart_data(out_dir)`` builds once; later calls find the stamp file and return at
once. Layout of ``out_dir``: ``tokenizer/`` (tokenizer.json + tokenizer_config.json),
``corpus.jsonl`` (the documents, for provenance), ``quickstart_text_document.{bin,idx,json}``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from nxd_data import __version__
from nxd_data.corpus import corpus_fingerprint, iter_corpus
from nxd_data.prepare import prepare_dataset
from nxd_data.train_tokenizer import train_bpe_tokenizer

STAMP = "quickstart.json"


def prepare_quickstart_data(out_dir: str | Path, vocab_size: int = 4096) -> dict[str, str]:
    """Return ``dict(tokenizer=<tokenizer dir>, data_prefix=<dataset prefix>)``, building them
    into ``out_dir`` unless a previous call with the same vocab size and corpus already did."""
    out = Path(out_dir)
    result = {"tokenizer": str(out / "tokenizer"), "data_prefix": str(out / "quickstart_text_document")}
    wanted = {"vocab_size": vocab_size, "corpus": corpus_fingerprint(), "nxd_data": __version__, **result}
    stamp = out / STAMP
    if stamp.is_file():
        try:
            if json.loads(stamp.read_text()) == wanted and Path(result["data_prefix"] + ".idx").is_file():
                return result
        except json.JSONDecodeError:
            pass
    out.mkdir(parents=True, exist_ok=True)
    docs = list(iter_corpus())
    corpus = out / "corpus.jsonl"
    tmp = out / f".corpus.jsonl.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        for doc in docs:
            fh.write(json.dumps({"text": doc}) + "\n")
    os.replace(tmp, corpus)
    train_bpe_tokenizer(docs, vocab_size, result["tokenizer"])
    prepare_dataset([corpus], result["tokenizer"], result["data_prefix"], progress=False)
    stamp.write_text(json.dumps(wanted, indent=2))
    return result
