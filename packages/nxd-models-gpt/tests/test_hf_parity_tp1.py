"""TP=1 (single process): nxd GPT vs transformers' GPT2LMHeadModel / GPTNeoXForCausalLM on the same
weights: logits, loss and every gradient; export round trip byte-equal and reloadable."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from gpt_test_utils import (  # noqa: E402
    CONFIGS,
    assert_same_tensors,
    batch,
    compare,
    hf_generate,
    hf_reference,
    load_hf,
    nxd_forward_backward,
    quiet_transformers,
    roundtrip_body,
    save_hf,
    vocab,
)

quiet_transformers()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_loss_grads_match_transformers(name, tmp_path):
    hf_dir = save_hf(name, tmp_path / name)
    data = batch(vocab(name))
    errors = compare(nxd_forward_backward(hf_dir, data), hf_reference(hf_dir, data))
    print(f"\nTP=1 {name}: {errors}")


@pytest.mark.parametrize("name", ["gpt2", "neox_sequential_padded"])
def test_export_roundtrip_and_greedy_tokens(name, tmp_path):
    """Import -> export is byte-equal, transformers reloads it with equal logits, and 20 greedy
    tokens equal transformers' generate."""
    src, out = save_hf(name, tmp_path / "src"), tmp_path / "out"
    prompt = batch(vocab(name))["input_ids"][:, :4]
    tokens = roundtrip_body(1, str(src), str(out), prompt, 20)
    assert_same_tensors(src, out)
    ids = batch(vocab(name))["input_ids"]
    assert torch.equal(load_hf(out)(ids).logits, load_hf(src)(ids).logits)
    assert tokens.equal(hf_generate(src, prompt, 20))
