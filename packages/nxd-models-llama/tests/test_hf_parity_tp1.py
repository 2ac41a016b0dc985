"""TP=1 (single process): nxd Llama vs transformers' LlamaForCausalLM on the same weights."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from nxd.transforms import parallelize_model

sys.path.insert(0, str(Path(__file__).parent))
from llama_test_utils import (  # noqa: E402
    CONFIGS,
    batch,
    compare,
    hf_reference,
    nxd_forward_backward,
    quiet_transformers,
    save_hf,
)

quiet_transformers()

from nxd_models_llama import LlamaConfig, LlamaForCausalLM, load_hf_checkpoint  # noqa: E402


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_loss_grads_match_transformers(name, tmp_path):
    hf_dir = save_hf(name, tmp_path / name)
    data = batch(CONFIGS[name]["vocab_size"])
    worst = compare(nxd_forward_backward(hf_dir, data), hf_reference(hf_dir, data))
    print(f"\nTP=1 {name}: worst relative error {worst:.3g}")


def _load(name: str, tmp_path: Path):
    from transformers import LlamaForCausalLM as HF

    hf_dir = save_hf(name, tmp_path / name)
    model = parallelize_model(LlamaForCausalLM(LlamaConfig.from_dict(CONFIGS[name])))
    load_hf_checkpoint(model, hf_dir)
    return model, HF.from_pretrained(str(hf_dir))


def test_loss_mask_and_ignore_index(tmp_path):
    model, hf = _load("gqa", tmp_path)
    data = batch()
    loss_mask = torch.ones(2, 16)
    loss_mask[0, :5] = 0
    labels = data["labels"].clone()
    labels[1, -3:] = -100
    ours = model(data["input_ids"], labels=labels, loss_mask=loss_mask).loss
    logits = hf(data["input_ids"]).logits
    keep = (loss_mask != 0) & (labels != -100)
    per_token = F.cross_entropy(logits.reshape(-1, 128), labels.clamp(min=0).reshape(-1), reduction="none")
    expected = (per_token * keep.reshape(-1)).sum() / keep.sum()
    assert abs(ours.item() - expected.item()) <= 1e-5 * expected.item()
    # every token masked: a finite zero, not NaN
    assert model(data["input_ids"], labels=labels, loss_mask=torch.zeros(2, 16)).loss.item() == 0.0


def test_packed_sequences_match_separate_examples(tmp_path):
    """Two examples packed in one row (positions restart, block-diagonal mask) give each example
    the logits it gets alone, for every attention_mask form the data convention allows."""
    model, _ = _load("llama3_rope", tmp_path)
    g = torch.Generator().manual_seed(3)
    a, b = torch.randint(0, 128, (1, 6), generator=g), torch.randint(0, 128, (1, 10), generator=g)
    packed = torch.cat([a, b], dim=1)
    positions = torch.cat([torch.arange(6), torch.arange(10)])[None]
    segments = torch.tensor([[1] * 6 + [2] * 10])
    block = (segments[:, :, None] == segments[:, None, :]) & torch.ones(16, 16, dtype=torch.bool).tril()
    alone = torch.cat([model(a).logits, model(b).logits], dim=1)
    for mask in (segments, block[:, None], None):
        kwargs = {"attention_mask": mask} if mask is not None else {"segment_ids": segments}
        got = model(packed, position_ids=positions, **kwargs).logits
        assert (got - alone).abs().max().item() <= 1e-5 * alone.abs().max().item()


def test_padding_mask_matches_transformers(tmp_path):
    model, hf = _load("mha", tmp_path)
    data = batch()
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 11:] = 0  # right padding
    ours = model(data["input_ids"], attention_mask=mask).logits
    ref = hf(data["input_ids"], attention_mask=mask).logits
    assert (ours[0] - ref[0]).abs().max() <= 1e-5 * ref.abs().max()
    assert (ours[1, :11] - ref[1, :11]).abs().max() <= 1e-5 * ref.abs().max()


def test_bad_inputs_name_the_problem(tmp_path):
    from nxd.errors import ConfigError

    with pytest.raises(ConfigError, match="num_key_value_heads"):
        LlamaConfig.from_dict({**CONFIGS["mha"], "num_key_value_heads": 3})
    with pytest.raises(ConfigError, match="llama config: rope_scaling.rope_type 'longrope' is not supported"):
        LlamaConfig.from_dict({**CONFIGS["mha"], "rope_scaling": {"rope_type": "longrope", "factor": 2.0}})
    with pytest.raises(ConfigError, match=r"rope_scaling keys \['low_freq_factor'\] are not part of rope_type 'yarn'"):
        LlamaConfig.from_dict({**CONFIGS["mha"], "rope_scaling": {"rope_type": "yarn", "factor": 2.0,
                                                                  "low_freq_factor": 1.0}})
    model = parallelize_model(LlamaForCausalLM(LlamaConfig.from_dict(CONFIGS["mha"])))
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_hf_checkpoint(model, tmp_path)
    hf_dir = save_hf("gqa", tmp_path / "gqa")
    with pytest.raises(ValueError, match="num_key_value_heads=2"):
        load_hf_checkpoint(model, hf_dir)
    with pytest.raises(ValueError, match="labels shape"):
        model(torch.zeros(2, 16, dtype=torch.long), labels=torch.zeros(2, 15, dtype=torch.long))
