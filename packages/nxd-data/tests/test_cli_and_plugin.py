"""The `nxd data` verbs through the real `nxd` command, plugin registration, and the quickstart."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import nxd
from nxd.cli import main
from nxd_data.indexed import IndexedDataset
from nxd_data.quickstart import prepare_quickstart_data
from nxd_data.tokenizers import load_tokenizer


def test_data_modules_and_command_are_registered() -> None:
    for name in ("indexed", "sft"):
        factory = nxd.get_data_module(name)
        assert callable(factory) and callable(factory.validate)
    assert "data" in nxd.list_components("command")


def test_cli_train_tokenizer_then_prepare(tmp_path: Path, corpus_docs: list[str], write_jsonl, capsys) -> None:
    src = write_jsonl(tmp_path / "c.jsonl", [{"body": d} for d in corpus_docs[:20]])
    assert main(["data", "train-tokenizer", "-i", str(src), "--text-key", "body", "--vocab-size", "400", "-o", str(tmp_path / "tok")]) == 0
    tok = load_tokenizer(tmp_path / "tok")
    assert tok.vocab_size == 400
    assert "not the" not in capsys.readouterr().out
    # 20 documents hold fewer mergeable pairs than 4096 - 256 - specials: the size is said, and why
    assert main(["data", "train-tokenizer", "-i", str(src), "--text-key", "body", "--vocab-size", "4096", "-o",
                 str(tmp_path / "short")]) == 0
    got = load_tokenizer(tmp_path / "short").vocab_size
    assert got < 4096 and f"; vocabulary {got}, not the 4096 asked (--vocab-size)" in capsys.readouterr().out
    assert main(["data", "prepare", "-i", str(src), "--text-key", "body", "-t", str(tmp_path / "tok"),
                 "-o", str(tmp_path / "ds"), "--quiet"]) == 0
    ds = IndexedDataset(tmp_path / "ds")
    assert ds[3].tolist() == tok.encode(corpus_docs[3]) + [tok.eos_id]
    capsys.readouterr()
    assert main(["data", "prepare", "-i", str(tmp_path / "nope.jsonl"), "-t", str(tmp_path / "tok"), "-o", str(tmp_path / "x")]) == 1
    assert "input " in capsys.readouterr().err and not (tmp_path / "x.bin").exists()


@pytest.mark.slow
def test_quickstart_builds_once(tmp_path: Path) -> None:
    paths = prepare_quickstart_data(tmp_path, vocab_size=1024)
    tok = load_tokenizer(paths["tokenizer"])
    ds = IndexedDataset(paths["data_prefix"])
    assert tok.vocab_size == 1024 and len(ds) > 100 and ds.num_tokens > 100_000
    text = "The assert statement"
    assert tok.decode(tok.encode(text)) == text
    stamp = (Path(paths["data_prefix"] + ".bin")).stat().st_mtime_ns
    start = time.perf_counter()
    assert prepare_quickstart_data(tmp_path, vocab_size=1024) == paths
    assert time.perf_counter() - start < 0.5
    assert Path(paths["data_prefix"] + ".bin").stat().st_mtime_ns == stamp
    dm = nxd.get_data_module("indexed")({"data_prefix": paths["data_prefix"]}, seq_length=256, micro_batch_size=8,
                                        global_batch_size=8, dp_rank=0, dp_size=1, seed=1)
    batch = next(dm.train_batches())
    assert batch["input_ids"].shape == (8, 256) and int(batch["input_ids"].max()) < 1024


def test_prepare_names_the_file_of_undecodable_input_and_offers_encodings(tmp_path: Path, corpus_docs: list[str], write_jsonl, capsys) -> None:
    src = write_jsonl(tmp_path / "c.jsonl", [{"body": d} for d in corpus_docs[:20]])
    assert main(["data", "train-tokenizer", "-i", str(src), "--text-key", "body", "--vocab-size", "300", "-o", str(tmp_path / "tok")]) == 0
    latin = tmp_path / "latin.txt"
    latin.write_bytes("café crème brûlée\n".encode("latin-1"))
    binary = tmp_path / "blob.txt"
    binary.write_bytes(bytes(range(256)) * 4)
    capsys.readouterr()
    for bad in (latin, binary):
        assert main(["data", "prepare", "-i", str(bad), "-t", str(tmp_path / "tok"), "-o", str(tmp_path / "x"), "--quiet"]) == 1
        err = capsys.readouterr().err
        assert str(bad) in err and "not valid utf-8 text at byte" in err and "--encoding" in err and "Traceback" not in err
    assert main(["data", "prepare", "-i", str(latin), "--encoding", "latin-1", "-t", str(tmp_path / "tok"),
                 "-o", str(tmp_path / "l1"), "--quiet"]) == 0
    assert main(["data", "prepare", "-i", str(binary), "--encoding-errors", "replace", "-t", str(tmp_path / "tok"),
                 "-o", str(tmp_path / "rep"), "--quiet"]) == 0
    assert len(IndexedDataset(tmp_path / "l1")) == 1
    assert main(["data", "prepare", "-i", str(latin), "--encoding", "klingon", "-t", str(tmp_path / "tok"),
                 "-o", str(tmp_path / "k"), "--quiet"]) == 1
    assert "'klingon' is not a known text encoding" in capsys.readouterr().err
