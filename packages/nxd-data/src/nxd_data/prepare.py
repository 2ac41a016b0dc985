"""``nxd data prepare``: documents -> tokens -> Megatron indexed dataset, atomically.

Tokenization runs in ``workers`` processes over chunks of documents; results are written in input
order, so the output is byte-identical for any worker count. Everything is written under
temporary names next to the output and renamed at the end: an interrupted or failed run leaves an
existing dataset with the same prefix untouched.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nxd.errors import ConfigError
from nxd_data.indexed import IndexedDatasetWriter, dtype_for_vocab, paths
from nxd_data.sources import iter_documents
from nxd_data.tokenizers import Tokenizer, load_tokenizer

_WORKER_TOKENIZER: Tokenizer | None = None


def _init_worker(tokenizer_path: str) -> None:
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = load_tokenizer(tokenizer_path)


def _encode_chunk(args: tuple[list[str], bool, bool]) -> list[np.ndarray]:
    texts, add_bos, append_eos = args
    assert _WORKER_TOKENIZER is not None
    return _encode(_WORKER_TOKENIZER, texts, add_bos, append_eos)


def _encode(tok: Tokenizer, texts: list[str], add_bos: bool, append_eos: bool) -> list[np.ndarray]:
    out = []
    for ids in tok.encode_batch(texts):
        if add_bos:
            ids = [tok.bos_id, *ids]
        if append_eos:
            ids = [*ids, tok.eos_id]
        out.append(np.asarray(ids, dtype=np.int64))
    return out


def _chunks(docs: Iterable[str], size: int) -> Iterator[list[str]]:
    it = iter(docs)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def prepare_dataset(
    inputs: Sequence[str | Path],
    tokenizer: str | Path,
    output_prefix: str | Path,
    *,
    fmt: str = "auto",
    text_key: str = "text",
    text_mode: str = "file",
    hf_split: str = "train",
    workers: int = 1,
    dtype: str = "auto",
    append_eos: bool = True,
    add_bos: bool = False,
    chunk_docs: int = 64,
    progress: bool = True,
    encoding: str = "utf-8",
    encoding_errors: str = "strict",
) -> dict[str, Any]:
    """Tokenize ``inputs`` into ``<output_prefix>.bin/.idx`` (+ ``<output_prefix>.json`` metadata).

    Every document ends with EOS (``append_eos``) so fixed-length samples that run across document
    boundaries keep them visible to the model. Empty documents are skipped. Returns the metadata.
    """
    tok = load_tokenizer(tokenizer)
    if append_eos and tok.eos_id is None:
        raise ConfigError(f"tokenizer {tokenizer} has no EOS token; it is needed between documents (or pass --no-eos)")
    if add_bos and tok.bos_id is None:
        raise ConfigError(f"tokenizer {tokenizer} has no BOS token; drop --add-bos")
    token_dtype = dtype_for_vocab(tok.vocab_size, dtype)
    if not inputs:
        raise ConfigError("no inputs given: pass text, JSONL, parquet files or a saved HF dataset")
    out_bin, out_idx = paths(output_prefix)
    out_meta = Path(str(output_prefix) + ".json")
    out_bin.parent.mkdir(parents=True, exist_ok=True)
    tag = f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp_bin, tmp_idx, tmp_meta = (Path(str(p) + tag) for p in (out_bin, out_idx, out_meta))
    writer = IndexedDatasetWriter(tmp_bin, tmp_idx, token_dtype)
    docs = (d for d in iter_documents(inputs, fmt, text_key, text_mode, hf_split, encoding, encoding_errors) if d)
    jobs = ((chunk, add_bos, append_eos) for chunk in _chunks(docs, chunk_docs))
    start = time.perf_counter()
    pool = None
    try:
        from tqdm import tqdm

        bar = tqdm(desc=f"prepare {Path(str(output_prefix)).name}", unit=" doc", disable=not progress)
        if workers > 1:
            ctx = multiprocessing.get_context("spawn")  # fork after tokenizers' threads is unsafe
            pool = ctx.Pool(workers, initializer=_init_worker, initargs=(tok.path,))
            results: Iterable[list[np.ndarray]] = pool.imap(_encode_chunk, jobs, chunksize=1)
        else:
            results = (_encode(tok, *job) for job in jobs)
        for encoded in results:
            for ids in encoded:
                writer.add(ids)
            bar.update(len(encoded))
            bar.set_postfix(tokens=writer.num_tokens, refresh=False)
        bar.close()
        writer.finish()
        if not writer.sizes:
            raise ConfigError(f"empty dataset: the inputs {', '.join(map(str, inputs))} hold no non-empty documents")
        meta = {
            "format": "megatron-mmap",
            "num_documents": len(writer.sizes),
            "num_tokens": writer.num_tokens,
            "dtype": token_dtype.name,
            "vocab_size": tok.vocab_size,
            "eos_id": tok.eos_id if append_eos else None,
            "bos_id": tok.bos_id,
            "pad_id": tok.pad_id,
            "tokenizer": str(Path(tok.path).resolve()),
            "inputs": [str(p) for p in inputs],
            "seconds": round(time.perf_counter() - start, 3),
        }
        tmp_meta.write_text(json.dumps(meta, indent=2), encoding="utf-8")
        # .idx last: it is what readers open first, and it is checked against the .bin size
        for tmp, final in ((tmp_meta, out_meta), (tmp_bin, out_bin), (tmp_idx, out_idx)):
            os.replace(tmp, final)
        return meta
    finally:
        writer.abort()
        if pool is not None:
            pool.terminate()
            pool.join()
        for tmp in (tmp_bin, tmp_idx, tmp_meta):
            tmp.unlink(missing_ok=True)


def read_metadata(prefix: str | Path) -> dict[str, Any]:
    """The ``<prefix>.json`` written by :func:`prepare_dataset` (empty for foreign datasets)."""
    path = Path(str(prefix) + ".json")
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return {}
