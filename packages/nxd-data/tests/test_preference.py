"""Preference data: TRL/NxDT tokenisation and truncation, response-only loss masks, chosen and
rejected rows in one batch, chat variants, DP sharding of the reference pass, exact resume."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from nxd.errors import ConfigError
from nxd_data.preference import record_texts, tokenize_pair
from nxd_data.preference_module import preference
from nxd_data.tokenizers import load_tokenizer

RECORDS = [{"prompt": f"Question {i}: which is better?", "chosen": f" answer {i} is good", "rejected": " bad"}
           for i in range(10)]


def _module(config: dict, seq: int = 48, mbs: int = 2, gbs: int = 4, dp_rank: int = 0, dp_size: int = 1):
    return preference(config, seq_length=seq, micro_batch_size=mbs, global_batch_size=gbs, dp_rank=dp_rank,
                      dp_size=dp_size, seed=3)


def _config(tmp_path: Path, tok_dir: Path, write_jsonl, records=RECORDS, **extra) -> dict:
    return {"train_dir": str(write_jsonl(tmp_path / "pairs.jsonl", records)), "tokenizer": str(tok_dir), **extra}


def test_batch_layout_and_masks(tmp_path: Path, tok_dir: Path, write_jsonl) -> None:
    tok = load_tokenizer(tok_dir)
    dm = _module(_config(tmp_path, tok_dir, write_jsonl))
    batch = next(dm.train_batches())
    assert batch["input_ids"].shape == (4, 48) and batch["example_index"].shape == (2,)
    for row, (k, name) in enumerate([(0, "chosen"), (1, "chosen"), (0, "rejected"), (1, "rejected")]):
        rec = RECORDS[int(batch["example_index"][k])]
        prompt = [tok.bos_id, *tok.encode(rec["prompt"])]
        response = [*tok.encode(rec[name]), tok.eos_id]
        tokens = prompt + response
        n = len(tokens) - 1
        assert batch["input_ids"][row, :n].tolist() == tokens[:-1]
        assert batch["labels"][row, :n].tolist() == tokens[1:]
        # the loss covers exactly the response tokens (and its EOS), never the prompt or padding
        assert batch["loss_mask"][row].nonzero().flatten().tolist() == list(range(len(prompt) - 1, n))
        assert batch["segment_ids"][row].sum() == n
    assert dm.info["pairs"] == 10


@pytest.mark.parametrize("mode", ["keep_start", "keep_end"])
def test_truncation_follows_trl(mode: str, tok_dir: Path) -> None:
    """TRL's rule (NxDT's tokeniser): prompt cut to max_prompt_length first, then responses cut to
    max_length - max_prompt_length."""
    tok = load_tokenizer(tok_dir)
    texts = ("the king and the queen of the night " * 4, " a sword " * 6, " love")
    prompt = [tok.bos_id, *tok.encode(texts[0])]
    chosen = [*tok.encode(texts[1]), tok.eos_id]
    pair = tokenize_pair(texts, tok, max_length=24, max_prompt_length=8, truncation_mode=mode)
    assert pair.prompt.tolist() == (prompt[:8] if mode == "keep_start" else prompt[-8:])
    assert pair.chosen.tolist() == chosen[:16]
    short = tokenize_pair(("hi", " yes", " no"), tok, max_length=24, max_prompt_length=8, truncation_mode=mode)
    assert short.prompt.tolist() == [tok.bos_id, *tok.encode("hi")]  # nothing cut when it fits


def test_chat_and_implicit_prompt_records(tok_dir: Path) -> None:
    tok = load_tokenizer(tok_dir)
    user = [{"role": "user", "content": "2+2?"}]
    explicit = {"prompt": user, "chosen": [{"role": "assistant", "content": "4"}],
                "rejected": [{"role": "assistant", "content": "5"}]}
    implicit = {"chosen": user + [{"role": "assistant", "content": "4"}],
                "rejected": user + [{"role": "assistant", "content": "5"}]}
    a, b = record_texts(explicit, tok, "x"), record_texts(implicit, tok, "y")
    assert a == b
    assert "2+2?" in a[0] and "4" in a[1] and "5" in a[2] and "4" not in a[0]


def test_bad_records_and_options_name_the_field(tmp_path: Path, tok_dir: Path, write_jsonl) -> None:
    config = _config(tmp_path, tok_dir, write_jsonl, [{"prompt": "p", "chosen": "c"}])
    with pytest.raises(ConfigError, match=r"pairs.jsonl:1: missing field\(s\) 'rejected'"):
        preference.validate({**config, "seq_length": 32})
    good = _config(tmp_path, tok_dir, write_jsonl)
    with pytest.raises(ConfigError, match="truncation_mode='middle': valid values are keep_start, keep_end"):
        preference.validate({**good, "seq_length": 32, "truncation_mode": "middle"})
    with pytest.raises(ConfigError, match=r"max_prompt_length=32 \(model_alignment_strategy.<dpo\|orpo>.max_prompt_length\) must be a positive integer below seq_length=32"):
        preference.validate({**good, "seq_length": 32, "max_prompt_length": 32})


def test_dev_choose_samples_takes_the_head(tmp_path: Path, tok_dir: Path, write_jsonl) -> None:
    dm = _module(_config(tmp_path, tok_dir, write_jsonl, dev_choose_samples=4))
    assert len(dm.sources["train"]) == 4


def test_reference_pass_covers_every_example_once_per_dp_split(tmp_path: Path, tok_dir: Path, write_jsonl) -> None:
    config = _config(tmp_path, tok_dir, write_jsonl)
    seen: list[int] = []
    counts = []
    for rank in range(2):
        dm = _module(config, mbs=2, gbs=4, dp_rank=rank, dp_size=2)
        batches = list(dm.reference_batches("train"))
        counts.append(len(batches))
        seen += [int(i) for b in batches for i in b["example_index"]]
    assert counts[0] == counts[1]  # matched collectives
    assert sorted(set(seen)) == list(range(10))


def test_resume_continues_the_stream_and_keeps_reference_logps(tmp_path: Path, tok_dir: Path, write_jsonl) -> None:
    config = _config(tmp_path, tok_dir, write_jsonl)
    table = np.random.default_rng(0).normal(size=(10, 2))
    first = _module(config)
    first.set_reference_logps("train", table)
    it = first.train_batches()
    for _ in range(3):
        next(it)
    state = first.state_dict()
    expected = [next(it) for _ in range(4)]  # crosses into the second epoch
    second = _module(config)
    second.load_state_dict(state)
    got = [b for b, _ in zip(second.train_batches(), range(4))]
    for a, b in zip(expected, got):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), key
    ref = got[0]["reference_chosen_logps"]
    assert torch.equal(ref, torch.from_numpy(table[got[0]["example_index"].numpy(), 0]))
    other = _module(_config(tmp_path, tok_dir, write_jsonl, dev_choose_samples=4))
    with pytest.raises(ConfigError, match="saved with 10 train preference pairs, this run has 4"):
        other.load_state_dict(state)
