"""`prepare_dataset`: token round trips, Megatron file layout, inputs, atomicity, and bad input."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nxd.errors import ConfigError
from nxd_data.indexed import IndexedDataset, dtype_for_vocab
from nxd_data.prepare import prepare_dataset
from nxd_data.tokenizers import load_tokenizer


def test_round_trip_and_megatron_layout(tmp_path: Path, tok_dir: Path, corpus_docs: list[str], write_jsonl) -> None:
    docs = corpus_docs[:12] + ["", "tail document"]  # the empty one is skipped
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": d} for d in docs])
    meta = prepare_dataset([src], tok_dir, tmp_path / "out" / "ds", progress=False)
    tok = load_tokenizer(tok_dir)
    expected = [tok.encode(d) + [tok.eos_id] for d in docs if d]
    assert meta["num_documents"] == len(expected)
    assert meta["num_tokens"] == sum(map(len, expected))

    ds = IndexedDataset(tmp_path / "out" / "ds")
    assert [ds[i].tolist() for i in range(len(ds))] == expected
    assert tok.decode(ds[len(ds) - 1].tolist()[:-1]) == "tail document"

    # the index as Megatron's MMapIndexedDataset reads it, parsed independently
    raw = (tmp_path / "out" / "ds.idx").read_bytes()
    assert raw[:9] == b"MMIDIDX\x00\x00"
    version, code, n, m = struct.unpack("<QBQQ", raw[9:34])
    assert (version, code, n, m) == (1, 8, len(expected), len(expected) + 1)  # 8 = uint16
    sizes = np.frombuffer(raw, np.int32, n, 34)
    pointers = np.frombuffer(raw, np.int64, n, 34 + 4 * n)
    assert sizes.tolist() == [len(e) for e in expected]
    assert pointers.tolist() == (np.cumsum([0] + sizes.tolist()[:-1]) * 2).tolist()
    tokens = np.fromfile(tmp_path / "out" / "ds.bin", dtype=np.uint16)
    assert tokens.tolist() == [t for e in expected for t in e]


def test_workers_give_identical_bytes(tmp_path: Path, tok_dir: Path, corpus_docs: list[str], write_jsonl) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": d} for d in corpus_docs])
    prepare_dataset([src], tok_dir, tmp_path / "one", progress=False)
    prepare_dataset([src], tok_dir, tmp_path / "two", workers=2, chunk_docs=3, progress=False)
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"one{ext}").read_bytes() == (tmp_path / f"two{ext}").read_bytes()


def test_text_parquet_and_modes(tmp_path: Path, tok_dir: Path) -> None:
    tok = load_tokenizer(tok_dir)
    text = tmp_path / "a.txt"
    text.write_text("first paragraph\nstill first\n\nsecond one\n", encoding="utf-8")
    prepare_dataset([text], tok_dir, tmp_path / "file", progress=False)
    assert IndexedDataset(tmp_path / "file")[0].tolist() == tok.encode(text.read_text()) + [tok.eos_id]
    prepare_dataset([text], tok_dir, tmp_path / "para", text_mode="paragraph", progress=False)
    para = IndexedDataset(tmp_path / "para")
    assert [tok.decode(para[i].tolist()[:-1]) for i in range(len(para))] == ["first paragraph\nstill first", "second one"]

    pq.write_table(pa.table({"body": ["alpha", "beta gamma"]}), tmp_path / "p.parquet")
    prepare_dataset([tmp_path / "p.parquet"], tok_dir, tmp_path / "pq", text_key="body", progress=False)
    pqds = IndexedDataset(tmp_path / "pq")
    assert [pqds[i].tolist() for i in range(2)] == [tok.encode("alpha") + [2], tok.encode("beta gamma") + [2]]
    with pytest.raises(ConfigError, match="missing column 'text'.*body"):
        prepare_dataset([tmp_path / "p.parquet"], tok_dir, tmp_path / "pq2", progress=False)


def test_bad_input_errors(tmp_path: Path, tok_dir: Path, write_jsonl) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n\n{"text": "broken"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad\.jsonl:3: malformed JSON"):
        prepare_dataset([bad], tok_dir, tmp_path / "x", progress=False)
    missing = write_jsonl(tmp_path / "m.jsonl", [{"text": "a"}, {"body": "b"}])
    with pytest.raises(ConfigError, match=r"m\.jsonl:2: missing field 'text' \(fields present: body\)"):
        prepare_dataset([missing], tok_dir, tmp_path / "x", progress=False)
    empty = write_jsonl(tmp_path / "e.jsonl", [{"text": ""}])
    with pytest.raises(ConfigError, match="empty dataset"):
        prepare_dataset([empty], tok_dir, tmp_path / "x", progress=False)
    assert not list(tmp_path.glob("x*")) and not list(tmp_path.glob(".*tmp*"))


def test_token_dtype_choice() -> None:
    assert dtype_for_vocab(32000) == np.uint16
    assert dtype_for_vocab(65536) == np.uint16
    assert dtype_for_vocab(128256) == np.int32
    with pytest.raises(ConfigError, match="vocab_size=128256 does not fit dtype uint16"):
        dtype_for_vocab(128256, "uint16")


def test_failed_prepare_never_corrupts_existing_output(tmp_path: Path, tok_dir: Path, write_jsonl) -> None:
    good = write_jsonl(tmp_path / "good.jsonl", [{"text": "keep me"}])
    prepare_dataset([good], tok_dir, tmp_path / "ds", progress=False)
    before = {p.name: p.read_bytes() for p in tmp_path.glob("ds.*")}
    # the malformed line comes after enough documents to have written tokens already
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "new"}\n' * 50 + "not json\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"broken\.jsonl:51"):
        prepare_dataset([broken], tok_dir, tmp_path / "ds", chunk_docs=4, progress=False)
    assert {p.name: p.read_bytes() for p in tmp_path.glob("ds.*")} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.jsonl", "ds.bin", "ds.idx", "ds.json", "good.jsonl"]


def test_hf_dataset_on_disk_without_datasets(tmp_path: Path, tok_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    saved = tmp_path / "hf"
    saved.mkdir()
    (saved / "state.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed (it is optional)
    with pytest.raises(ConfigError, match=r"pip install .nxd-data\[hf\]."):
        prepare_dataset([saved], tok_dir, tmp_path / "x", progress=False)
