"""SFT: prompt masking, chat masking, packing == padding for a model that honours the mask, errors."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from nxd.errors import ConfigError
from nxd_data.factories import sft
from nxd_data.tokenizers import load_tokenizer

RECORDS = [
    {"prompt": "Translate: cat", "completion": " -> Katze"},
    {"prompt": "What is 2+2?", "completion": " 4"},
    {"prompt": "Name a prime.", "completion": " Seven is prime."},
    {"prompt": "Say hi", "completion": " hi!"},
    {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
                  {"role": "user", "content": "and 3+3?"}, {"role": "assistant", "content": "6"}]},
    {"prompt": "Longer prompt about the assert statement in Python", "completion": " it raises AssertionError"},
]


def _module(config: dict, seq: int = 64, mbs: int = 2, gbs: int = 2, seed: int = 0):
    return sft(config, seq_length=seq, micro_batch_size=mbs, global_batch_size=gbs, dp_rank=0, dp_size=1, seed=seed)


def _rows(dm, n_rows: int) -> list[dict[str, torch.Tensor]]:
    it = dm.train_batches()
    out = []
    while len(out) < n_rows:
        b = next(it)
        out += [{k: v[i] for k, v in b.items()} for i in range(b["input_ids"].shape[0])]
    return out[:n_rows]


def test_prompt_tokens_are_masked(tmp_path: Path, tok_dir: Path, write_jsonl) -> None:
    tok = load_tokenizer(tok_dir)
    data = write_jsonl(tmp_path / "train.jsonl", RECORDS[:4])
    dm = _module({"train_dir": str(data), "tokenizer": str(tok_dir), "packing": False, "shuffle": False})
    for rec, row in zip(RECORDS[:4], _rows(dm, 4)):
        prompt, completion = tok.encode(rec["prompt"]), tok.encode(rec["completion"])
        full = [tok.bos_id, *prompt, *completion, tok.eos_id]
        n = len(full) - 1
        assert row["input_ids"][:n].tolist() == full[:-1]
        assert row["labels"][:n].tolist() == full[1:]
        assert row["labels"][row["loss_mask"] == 1].tolist() == [*completion, tok.eos_id]
        assert row["loss_mask"][n:].sum() == 0 and row["segment_ids"][n:].eq(0).all()
        assert row["position_ids"][:n].tolist() == list(range(n))


def test_nxdt_input_output_records_equal_prompt_completion(tmp_path: Path, tok_dir: Path, write_jsonl) -> None:
    """NxD Training's SFT JSONL says ``input``/``output``; the rows equal prompt/completion ones."""
    ours = write_jsonl(tmp_path / "ours.jsonl", RECORDS[:4])
    nxdt = write_jsonl(tmp_path / "nxdt.jsonl", [{"input": r["prompt"], "output": r["completion"]} for r in RECORDS[:4]])
    rows = [_rows(_module({"train_dir": str(path), "tokenizer": str(tok_dir), "packing": False, "shuffle": False}), 4)
            for path in (ours, nxdt)]
    for a, b in zip(*rows):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_chat_messages_train_only_on_assistant_turns(tmp_path: Path, tok_dir: Path, write_jsonl) -> None:
    tok = load_tokenizer(tok_dir)
    data = write_jsonl(tmp_path / "chat.jsonl", [RECORDS[4]])
    row = _rows(_module({"train_dir": str(data), "tokenizer": str(tok_dir), "packing": False}, mbs=1, gbs=1), 1)[0]
    targets = row["labels"][row["loss_mask"] == 1].tolist()
    assert targets == tok.encode("4<|end|>\n") + tok.encode("6<|end|>\n") + [tok.eos_id]


def test_packing_keeps_examples_whole_and_separate(tmp_path: Path, tok_dir: Path, write_jsonl) -> None:
    data = write_jsonl(tmp_path / "train.jsonl", RECORDS * 3)
    dm = _module({"train_dir": str(data), "tokenizer": str(tok_dir)}, seq=48)
    n_rows = dm.info["rows"]
    assert n_rows < len(RECORDS) * 3  # several examples share a row
    rows = _rows(dm, n_rows)  # one epoch
    examples = 0
    for row in rows:
        seg, pos = row["segment_ids"], row["position_ids"]
        for k in range(1, int(seg.max()) + 1):
            where = (seg == k).nonzero().flatten()
            assert where.tolist() == list(range(int(where[0]), int(where[-1]) + 1))  # contiguous
            assert pos[where].tolist() == list(range(len(where)))  # positions restart per example
            examples += 1
        mask = row["attention_mask"][0]
        assert torch.equal(mask, (seg[:, None] == seg[None, :]) & torch.ones(48, 48, dtype=torch.bool).tril())
    assert examples == len(RECORDS) * 3


class TinyLM(torch.nn.Module):
    """Embedding + one causal attention layer that honours position_ids and the boolean mask."""

    def __init__(self, vocab: int, dim: int = 16, max_pos: int = 128) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.tok = torch.nn.Parameter(torch.randn(vocab, dim, generator=g, dtype=torch.float64))
        self.pos = torch.nn.Parameter(torch.randn(max_pos, dim, generator=g, dtype=torch.float64))
        self.qkv = torch.nn.Parameter(torch.randn(dim, 3 * dim, generator=g, dtype=torch.float64) / math.sqrt(dim))
        self.out = torch.nn.Parameter(torch.randn(dim, vocab, generator=g, dtype=torch.float64) / math.sqrt(dim))

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.tok[input_ids] + self.pos[position_ids]
        q, k, v = (h @ self.qkv).chunk(3, dim=-1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(~attention_mask[:, 0], float("-inf"))
        h = h + torch.softmax(scores, dim=-1) @ v
        return h @ self.out


def _per_example_losses(dm, n_rows: int, model: TinyLM) -> dict[tuple[int, ...], list[float]]:
    out = {}
    for row in _rows(dm, n_rows):
        logits = model(row["input_ids"][None], row["position_ids"][None], row["attention_mask"][None])[0]
        ce = F.cross_entropy(logits, row["labels"], reduction="none")
        for k in range(1, int(row["segment_ids"].max()) + 1):
            sel = row["segment_ids"] == k
            key = tuple(row["input_ids"][sel].tolist())
            out[key] = ce[sel][row["loss_mask"][sel] == 1].tolist()
    return out


def test_packed_and_padded_give_the_same_per_token_loss(tmp_path: Path, tok_dir: Path, write_jsonl) -> None:
    data = write_jsonl(tmp_path / "train.jsonl", RECORDS)
    base = {"train_dir": str(data), "tokenizer": str(tok_dir)}
    padded = _module({**base, "packing": False}, seq=48)
    packed = _module({**base, "packing": True}, seq=48)
    assert packed.info["rows"] < padded.info["rows"] == len(RECORDS)
    model = TinyLM(load_tokenizer(tok_dir).vocab_size)
    alone = _per_example_losses(padded, padded.info["rows"], model)
    together = _per_example_losses(packed, packed.info["rows"], model)
    assert alone.keys() == together.keys() and len(alone) == len(RECORDS)
    worst = max(abs(a - b) for key in alone for a, b in zip(alone[key], together[key], strict=True))
    assert worst < 1e-12, worst
    # the mask matters: without it, packed examples see each other and the losses change
    row = _rows(_module({**base, "packing": True}, seq=48), 1)[0]
    causal = torch.ones(1, 1, 48, 48, dtype=torch.bool).tril()
    assert int(row["segment_ids"].max()) > 1
    with_mask = model(row["input_ids"][None], row["position_ids"][None], row["attention_mask"][None])
    without = model(row["input_ids"][None], row["position_ids"][None], causal)
    assert not torch.allclose(with_mask, without)


def test_truncation_and_resume(tmp_path: Path, tok_dir: Path, write_jsonl) -> None:
    data = write_jsonl(tmp_path / "train.jsonl", RECORDS * 4)
    config = {"train_dir": str(data), "tokenizer": str(tok_dir)}
    dm = _module(config, seq=12)
    assert dm.info["truncated"] > 0
    it = dm.train_batches()
    for _ in range(5):
        assert next(it)["input_ids"].shape == (2, 12)
    state = dm.state_dict()
    want = [next(it) for _ in range(6)]
    again = _module(config, seq=12)
    again.load_state_dict(state)
    it2 = again.train_batches()
    for w in want:
        g = next(it2)
        assert all(torch.equal(g[k], w[k]) for k in w)


def test_dev_choose_samples_trains_on_the_head(tmp_path: Path, tok_dir: Path, write_jsonl) -> None:
    """NxDT's data.dev_choose_samples (its SFT configs set 2250): the first N records of each split,
    exactly the rows of a file holding only those records."""
    data = write_jsonl(tmp_path / "train.jsonl", RECORDS)
    head = write_jsonl(tmp_path / "head.jsonl", RECORDS[:3])
    base = {"tokenizer": str(tok_dir), "packing": False, "shuffle": False}
    chosen = _module({**base, "train_dir": str(data), "val_dir": str(data), "dev_choose_samples": 3})
    alone = _module({**base, "train_dir": str(head), "val_dir": str(head)})
    assert chosen.info["examples"] == 3 and chosen.info["rows"] == 3
    for got, want in zip(_rows(chosen, 6), _rows(alone, 6)):  # two epochs of the three records
        assert all(torch.equal(got[k], want[k]) for k in want)
    with pytest.raises(ConfigError, match="data.dev_choose_samples must be a positive integer or null, got 0"):
        sft.validate({**base, "train_dir": str(data), "dev_choose_samples": 0})


def test_bad_sft_input(tmp_path: Path, tok_dir: Path, write_jsonl) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": \n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad\.jsonl:2: malformed JSON"):
        sft.validate({"train_dir": str(bad), "tokenizer": str(tok_dir)})
    missing = write_jsonl(tmp_path / "m.jsonl", [{"prompt": "only a prompt"}])
    with pytest.raises(ConfigError, match=r"m\.jsonl:1: missing field 'completion'"):
        _module({"train_dir": str(missing), "tokenizer": str(tok_dir)})
    neither = write_jsonl(tmp_path / "n.jsonl", [{"question": "?"}])
    with pytest.raises(ConfigError, match=r"need 'prompt' and 'completion' \(NxD Training: 'input' and 'output'\), or 'messages' "
                       r"\(fields present: question\)"):
        _module({"train_dir": str(neither), "tokenizer": str(tok_dir)})
    with pytest.raises(ConfigError, match="data.train_dir is required"):
        sft.validate({"tokenizer": str(tok_dir)})
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match="empty SFT dataset"):
        _module({"train_dir": str(empty), "tokenizer": str(tok_dir)})
    with pytest.raises(ConfigError, match="data.packing must be true or false"):
        sft.validate({"train_dir": str(missing), "tokenizer": str(tok_dir), "packing": "yes"})
