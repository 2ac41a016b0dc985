"""Saved Hugging Face datasets: `nxd data prepare` input and the `hf` data module."""

from __future__ import annotations

from pathlib import Path

import datasets
import numpy as np
import pytest
import torch

import nxd
from nxd.cli import main
from nxd.errors import ConfigError
from nxd_data.factories import indexed
from nxd_data.hf_module import hf
from nxd_data.indexed import IndexedDataset
from nxd_data.prepare import prepare_dataset
from nxd_data.tokenizers import load_tokenizer

SEQ, MBS, GBS = 8, 2, 8


@pytest.fixture
def text_dict(tmp_path: Path, corpus_docs: list[str]) -> tuple[Path, list[str], list[str]]:
    """A DatasetDict with train/validation splits and the text in column ``body``."""
    train, valid = [d[:400] for d in corpus_docs[:10]], ["short validation text " * 8, "another one here " * 8]
    dd = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"body": train, "n": list(range(len(train)))}),
        "validation": datasets.Dataset.from_dict({"body": valid, "n": [0, 1]}),
    })
    dd.save_to_disk(str(tmp_path / "dd"))
    return tmp_path / "dd", train, valid


def _token_rows(tmp_path: Path, lengths: list[int]) -> tuple[Path, list[list[int]]]:
    """A pre-tokenized Dataset whose row ``i`` is ``1000*(i+1) + 0..len-1`` (every token names its row)."""
    rows = [[1000 * (i + 1) + t for t in range(n)] for i, n in enumerate(lengths)]
    datasets.Dataset.from_dict({"input_ids": rows, "labels": rows}).save_to_disk(str(tmp_path / "ids"))
    return tmp_path / "ids", rows


def _dm(config: dict, dp_rank: int = 0, dp: int = 1, seed: int = 3):
    return hf(config, seq_length=SEQ, micro_batch_size=MBS, global_batch_size=GBS, dp_rank=dp_rank, dp_size=dp, seed=seed)


def _take(dm, n: int) -> list[dict[str, torch.Tensor]]:
    it = dm.train_batches()
    return [next(it) for _ in range(n)]


# ---------------------------------------------------------------------------------- nxd data prepare
def test_prepare_split_and_column_round_trip(tmp_path: Path, tok_dir: Path, text_dict) -> None:
    path, train, valid = text_dict
    tok = load_tokenizer(tok_dir)
    for split, docs in (("train", train), ("validation", valid)):
        meta = prepare_dataset([path], tok_dir, tmp_path / split, text_key="body", hf_split=split, progress=False)
        ds = IndexedDataset(tmp_path / split)
        assert meta["num_documents"] == len(docs)
        assert [ds[i].tolist() for i in range(len(ds))] == [tok.encode(d) + [tok.eos_id] for d in docs]
    # the same through the command line, with a single saved Dataset (no splits to pick)
    datasets.Dataset.from_dict({"body": valid}).save_to_disk(str(tmp_path / "single"))
    assert main(["data", "prepare", "-i", str(tmp_path / "single"), "--text-key", "body", "-t", str(tok_dir),
                 "-o", str(tmp_path / "cli"), "--quiet"]) == 0
    cli = IndexedDataset(tmp_path / "cli")
    assert [cli[i].tolist() for i in range(len(cli))] == [tok.encode(d) + [tok.eos_id] for d in valid]


def test_prepare_bad_split_and_column(tmp_path: Path, tok_dir: Path, text_dict, capsys) -> None:
    path = text_dict[0]
    with pytest.raises(ConfigError, match=r"no split 'test' \(splits: train, validation\)"):
        prepare_dataset([path], tok_dir, tmp_path / "x", text_key="body", hf_split="test", progress=False)
    with pytest.raises(ConfigError, match=r"no column 'text' \(columns: body, n\)"):
        prepare_dataset([path], tok_dir, tmp_path / "x", progress=False)
    with pytest.raises(ConfigError, match=r"column 'n' .* not text.*string columns: body"):
        prepare_dataset([path], tok_dir, tmp_path / "x", text_key="n", progress=False)
    assert main(["data", "prepare", "-i", str(path), "-t", str(tok_dir), "-o", str(tmp_path / "x"), "--quiet"]) == 1
    assert "no column 'text' (columns: body, n)" in capsys.readouterr().err
    assert not list(tmp_path.glob("x*"))


# ---------------------------------------------------------------------------------------- hf module
def test_hf_is_registered() -> None:
    factory = nxd.get_data_module("hf")
    assert factory is hf and callable(factory.validate)


def test_rows_batches_follow_the_indexed_convention(tmp_path: Path) -> None:
    path, rows = _token_rows(tmp_path, [SEQ + 1, SEQ] * 4)
    dm = _dm({"train_dir": str(path), "shuffle": False})
    assert dm.info["packing"] == "rows"
    batches = _take(dm, 4)  # one epoch of 8 rows, in order
    seen = [(b["input_ids"][j], b["labels"][j], b["loss_mask"][j], b["position_ids"][j]) for b in batches for j in range(MBS)]
    for row, (ids, labels, mask, pos) in zip(rows, seen):
        assert ids.tolist() == row[:SEQ] and pos.tolist() == list(range(SEQ))
        if len(row) == SEQ + 1:
            assert labels.tolist() == row[1:] and mask.tolist() == [1.0] * SEQ
        else:  # NxDT layout: the last position has no next token inside the row
            assert labels[:-1].tolist() == row[1:] and mask.tolist() == [1.0] * (SEQ - 1) + [0.0]
    assert batches[0]["input_ids"].dtype == torch.int64 and batches[0]["loss_mask"].dtype == torch.float32


@pytest.mark.parametrize("dp", [2, 4])
def test_dp_shards_are_disjoint_and_cover_each_step(tmp_path: Path, dp: int) -> None:
    path, rows = _token_rows(tmp_path, [SEQ + 1] * 16)  # two global batches per epoch
    config = {"train_dir": str(path)}
    steps = 4  # two epochs
    ref = _take(_dm(config), steps * GBS // MBS)
    ranks = [_take(_dm(config, r, dp), steps * GBS // (MBS * dp)) for r in range(dp)]
    per_step = GBS // (MBS * dp)
    epoch_rows: list[tuple[int, ...]] = []
    for step in range(steps):
        got = [tuple(x.tolist()) for r in ranks for b in r[step * per_step:(step + 1) * per_step] for x in b["input_ids"]]
        want = [tuple(x.tolist()) for b in ref[step * GBS // MBS:(step + 1) * GBS // MBS] for x in b["input_ids"]]
        assert len(set(got)) == GBS and sorted(got) == sorted(want)  # disjoint, and the whole global batch
        epoch_rows += got
        if (step + 1) % 2 == 0:  # each epoch visits every row once
            assert sorted(epoch_rows) == sorted(tuple(r[:SEQ]) for r in rows)
            epoch_rows = []


def test_text_concat_matches_prepare_plus_indexed(tmp_path: Path, tok_dir: Path, text_dict) -> None:
    path = text_dict[0]
    config = {"train_dir": str(path), "text_key": "body", "tokenizer": str(tok_dir)}
    prepare_dataset([path], tok_dir, tmp_path / "pre", text_key="body", progress=False)
    ref = indexed({"data_prefix": str(tmp_path / "pre"), "splits_string": "1,0,0"}, seq_length=SEQ,
                  micro_batch_size=MBS, global_batch_size=GBS, dp_rank=1, dp_size=2, seed=3)
    dm = _dm(config, dp_rank=1, dp=2)
    assert dm.info["packing"] == "concat" and dm.info["train_samples"] == len(ref.train_stream.source)
    for got, want in zip(_take(dm, 6), _take(ref, 6)):
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    # unshuffled, the first sample is the first seq_length+1 tokens of the documents in order
    tok = load_tokenizer(tok_dir)
    flat = [t for d in text_dict[1] for t in tok.encode(d) + [tok.eos_id]]
    first = _take(_dm({**config, "shuffle": False}), 1)[0]
    assert first["input_ids"][0].tolist() == flat[:SEQ] and first["labels"][0].tolist() == flat[1:SEQ + 1]


def test_exact_resume(tmp_path: Path, tok_dir: Path, text_dict) -> None:
    config = {"train_dir": str(text_dict[0]), "text_key": "body", "tokenizer": str(tok_dir), "val_dir": str(text_dict[0])}
    full = _dm(config, dp_rank=1, dp=2)
    it = full.train_batches()
    for _ in range(5):
        next(it)
    state = full.state_dict()
    rest = [next(it) for _ in range(60)]
    assert len(full.train_stream.source) < (5 + 60) * MBS * 2  # so the resumed part crosses an epoch
    resumed = _dm(config, dp_rank=1, dp=2)
    resumed.load_state_dict(state)
    again = resumed.train_batches()
    for want in rest:
        got = next(again)
        assert all(torch.equal(got[k], want[k]) for k in want)
    assert resumed.num_valid_batches() == len(resumed.valid_source) // (MBS * 2) > 0


def test_module_errors(tmp_path: Path, tok_dir: Path, text_dict) -> None:
    path = text_dict[0]
    with pytest.raises(ConfigError, match="data.train_dir is required"):
        hf.validate({})
    with pytest.raises(ConfigError, match=r"data.train_dir: .*no split 'dev' \(splits: train, validation\)"):
        hf.validate({"train_dir": str(path), "train_split": "dev"})
    with pytest.raises(ConfigError, match=r"neither .*'input_ids'.*'text'.*columns: body, n"):
        hf.validate({"train_dir": str(path)})
    with pytest.raises(ConfigError, match="data.tokenizer is required.*text column 'body'"):
        hf.validate({"train_dir": str(path), "text_key": "body"})
    with pytest.raises(ConfigError, match="must hold lists of integer token ids"):
        hf.validate({"train_dir": str(path), "input_ids_key": "n"})
    with pytest.raises(ConfigError, match="not a Hugging Face dataset saved with save_to_disk"):
        hf.validate({"train_dir": str(tmp_path)})
    ids, _ = _token_rows(tmp_path, [SEQ + 1, SEQ + 3])
    with pytest.raises(ConfigError, match=r"row 1 holds 11 .*packing: concat"):
        hf.validate({"train_dir": str(ids), "seq_length": SEQ})
    with pytest.raises(ConfigError, match="data.packing='pack' is not known; valid: rows, concat"):
        hf.validate({"train_dir": str(ids), "packing": "pack"})
    dm = _dm({"train_dir": str(ids), "packing": "concat", "shuffle": False})  # the fix the error suggests
    assert dm.info["train_samples"] == (2 * SEQ + 4 - 1) // SEQ
    assert np.array_equal(_take(dm, 1)[0]["input_ids"][1].numpy(), np.array([1000 + SEQ] + [2000 + t for t in range(SEQ - 1)]))
