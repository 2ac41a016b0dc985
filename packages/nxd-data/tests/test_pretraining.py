"""Pretraining samples: windows across documents, shifted labels, splits, blends, cache, options."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from nxd.errors import ConfigError
from nxd_data.factories import indexed
from nxd_data.gpt_dataset import GPTSamples, split_ranges
from nxd_data.indexed import IndexedDataset


def _module(config: dict, seq: int = 16, mbs: int = 2, gbs: int = 4, dp_rank: int = 0, dp: int = 1, seed: int = 3):
    return indexed(config, seq_length=seq, micro_batch_size=mbs, global_batch_size=gbs, dp_rank=dp_rank, dp_size=dp, seed=seed)


def _take(it, n: int) -> list[dict[str, torch.Tensor]]:
    return [next(it) for _ in range(n)]


def test_windows_run_across_documents_with_shifted_labels(tmp_path: Path, marked_dataset) -> None:
    prefix = marked_dataset(tmp_path / "d", 30, base=10)
    ds = IndexedDataset(prefix)
    stream = np.concatenate([ds[i] for i in range(len(ds))])  # documents in file order, EOS-terminated
    seq = 16
    dm = _module({"data_prefix": str(prefix), "splits_string": "1,0,0", "shuffle": False}, seq=seq)
    n = (len(stream) - 1) // seq
    rows = torch.cat([b["input_ids"] for b in _take(dm.train_batches(), n // 2)])
    labels = torch.cat([b["labels"] for b in _take(_module({"data_prefix": str(prefix), "splits_string": "1,0,0", "shuffle": False}, seq=seq).train_batches(), n // 2)])
    for k in range(rows.shape[0]):
        assert rows[k].tolist() == stream[k * seq : k * seq + seq].tolist()
        assert labels[k].tolist() == stream[k * seq + 1 : k * seq + seq + 1].tolist()
    batch = next(_module({"data_prefix": str(prefix)}, seq=seq).train_batches())
    assert batch["position_ids"].tolist() == [list(range(seq))] * 2
    assert batch["loss_mask"].dtype == torch.float32 and bool((batch["loss_mask"] == 1).all())
    assert "attention_mask" not in batch


def test_shuffled_epoch_visits_every_sample_once(tmp_path: Path, marked_dataset) -> None:
    prefix = marked_dataset(tmp_path / "d", 40, base=10)
    dm = _module({"data_prefix": str(prefix), "splits_string": "1,0,0"}, seq=8, mbs=1, gbs=1)
    gs = GPTSamples(IndexedDataset(prefix), (0, 40), 8, 3, cache_dir=None)
    expected = sorted(tuple(gs.window(i)[:-1].tolist()) for i in range(len(gs)))
    it = dm.train_batches()
    seen = sorted(tuple(next(it)["input_ids"][0].tolist()) for _ in range(len(gs)))
    assert seen == expected
    # the shuffled document order still covers every document exactly once
    assert sorted(gs.doc_order.tolist()) == list(range(40))


def test_splits_use_disjoint_document_ranges(tmp_path: Path, marked_dataset) -> None:
    prefix = marked_dataset(tmp_path / "d", 100, base=10)
    assert split_ranges("80,10,10", 100) == [(0, 80), (80, 90), (90, 100)]
    assert split_ranges("980,10,10", 7) == [(0, 7), (7, 7), (7, 7)]
    dm = _module({"data_prefix": str(prefix), "splits_string": "80,10,10"}, seq=8)
    it = dm.train_batches()
    train_docs = {t - 10 for _ in range(40) for t in next(it)["input_ids"].flatten().tolist() if t != 2}
    valid_docs = {t - 10 for b in dm.valid_batches() for t in b["input_ids"].flatten().tolist() if t != 2}
    assert train_docs <= set(range(80)) and len(train_docs) > 60
    assert valid_docs <= set(range(80, 90)) and valid_docs
    assert dm.num_valid_batches() == sum(1 for _ in dm.valid_batches())


@pytest.mark.parametrize("weights", [(0.7, 0.3), (0.5, 0.3, 0.2)])
def test_blend_hits_weights_on_every_prefix(tmp_path: Path, marked_dataset, weights: tuple[float, ...]) -> None:
    prefixes = [marked_dataset(tmp_path / f"d{k}", 20, base=100 * (k + 1), seed=k) for k in range(len(weights))]
    config = {"data_prefix": [x for w, p in zip(weights, prefixes) for x in (w, str(p))], "splits_string": "1,0,0"}
    dm = _module(config, seq=4, mbs=4, gbs=4)
    it = dm.train_batches()
    counts = np.zeros(len(weights))
    for step in range(100):
        for row in next(it)["input_ids"]:
            marker = next(t for t in row.tolist() if t != 2)  # skip a leading EOS
            counts[marker // 100 - 1] += 1
        n = 4 * (step + 1)
        assert np.all(np.abs(counts - np.array(weights) * n) <= 1.0 + 1e-9), (n, counts)


def test_sample_index_is_cached(tmp_path: Path, marked_dataset) -> None:
    prefix = marked_dataset(tmp_path / "d", 50, base=10)
    ds = IndexedDataset(prefix)
    first = GPTSamples(ds, (0, 50), 8, 1, cache_dir=tmp_path / "cache")
    again = GPTSamples(ds, (0, 50), 8, 1, cache_dir=tmp_path / "cache")
    other_seed = GPTSamples(ds, (0, 50), 8, 2, cache_dir=tmp_path / "cache")
    assert (first.cache_hit, again.cache_hit, other_seed.cache_hit) == (False, True, False)
    assert np.array_equal(first.sample_idx, again.sample_idx) and np.array_equal(first.doc_order, again.doc_order)
    assert len(list((tmp_path / "cache").glob("*.npy"))) == 4


def test_megatron_reset_options(tmp_path: Path, marked_dataset) -> None:
    prefix = marked_dataset(tmp_path / "d", 30, base=10)
    config = {"data_prefix": str(prefix), "splits_string": "1,0,0", "shuffle": False, "eos_id": 2,
              "reset_position_ids": True, "reset_attention_mask": True, "eod_mask_loss": True}
    b = next(_module(config, seq=32).train_batches())
    ids, pos, seg, mask = b["input_ids"][0], b["position_ids"][0], b["segment_ids"][0], b["attention_mask"][0, 0]
    eos_at = (ids == 2).nonzero().flatten().tolist()
    assert eos_at  # the window crosses documents
    for t in range(1, 32):
        assert pos[t] == (0 if ids[t - 1] == 2 else pos[t - 1] + 1)
    assert b["loss_mask"][0][eos_at].sum() == 0 and b["loss_mask"][0].sum() == 32 - len(eos_at)
    for q in range(32):
        for k in range(32):
            assert bool(mask[q, k]) == (k <= q and seg[q] == seg[k])


def test_bad_configs_are_reported_before_training(tmp_path: Path, marked_dataset) -> None:
    prefix = marked_dataset(tmp_path / "d", 5, base=10)
    tokens = IndexedDataset(prefix).num_tokens
    with pytest.raises(ConfigError, match=rf"seq_length=500 is larger than the train split .* {tokens} tokens"):
        indexed.validate({"data_prefix": str(prefix), "splits_string": "1,0,0", "seq_length": 500})
    with pytest.raises(ConfigError, match="seq_length=500"):
        _module({"data_prefix": str(prefix), "splits_string": "1,0,0"}, seq=500)
    with pytest.raises(ConfigError, match="data.data_prefix is required"):
        indexed.validate({})
    with pytest.raises(ConfigError, match=r"missing\.bin does not exist"):
        indexed.validate({"data_prefix": str(tmp_path / "missing")})
    with pytest.raises(ConfigError, match="splits_string='a,b'"):
        indexed.validate({"data_prefix": str(prefix), "splits_string": "a,b"})
    with pytest.raises(ConfigError, match="alternates numbers and paths"):
        indexed.validate({"data_prefix": [0.5, str(prefix), 0.5]})
    # NxDT's Megatron data keys: its configs' values are what this module does; others are refused
    nxdt = {"data_impl": "mmap", "dataloader_type": "single", "no_seqlen_plus_one_input_tokens": False,
            "pad_samples_to_global_batch_size": False, "validation_drop_last": True, "skip_warmup": True}
    indexed.validate({"data_prefix": str(prefix), "splits_string": "1,0,0", **nxdt})
    with pytest.raises(ConfigError, match=r"data.dataloader_type='cyclic' is not supported: nxd's sampler is "
                                          r"Megatron's sequential 'single' sampler"):
        indexed.validate({"data_prefix": str(prefix), **nxdt, "dataloader_type": "cyclic"})
    with pytest.raises(ConfigError, match="global_batch_size=6 must be a multiple"):
        _module({"data_prefix": str(prefix)}, seq=4, mbs=2, gbs=6, dp=2)
    # a .bin that does not match its .idx
    (tmp_path / "d.bin").write_bytes(b"\x00\x00")
    with pytest.raises(ConfigError, match="do not belong together"):
        IndexedDataset(prefix)
