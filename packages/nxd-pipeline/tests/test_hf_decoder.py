"""Hugging Face decoder-only LMs (transformers' Llama, Mistral, Qwen2, Gemma 3) pipeline-split with no
adapter methods of their own, on two real gloo ranks, against the unsplit model in one process
(fp32 loss and every gradient; auto and manual cuts, tied embeddings across stages)."""

from __future__ import annotations

import copy

import pytest
import torch

from nxd.errors import ConfigError
from nxd_pipeline import NxDPPModel
from nxd_pipeline.partition import model_layout

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.1)
#: (model family, pipeline_config extras, tied embeddings)
CASES = [
    ("llama", {}, False),
    ("llama", {"pipeline_cuts": ["model.layers.0"]}, True),  # manual cut: stages of 1 and 3 layers
    ("mistral", {"auto_partition": True}, False),
    ("qwen2", {"pipeline_cuts": [2], "schedule": "gpipe"}, False),
    # sliding and full layers, whose mask and rotary embeddings Gemma 3's forward picks by the loop's
    # index (config.layer_types[i]): each stage's layers need their own kind's arguments
    ("gemma3", {"pipeline_cuts": [1]}, True),
]
#: family -> (config class, causal-LM class, extra config keys)
CLASSES = {"llama": ("LlamaConfig", "LlamaForCausalLM", {}), "mistral": ("MistralConfig", "MistralForCausalLM", {}),
           "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
           "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                      {"sliding_window": 4, "head_dim": 8, "layer_types": ["sliding_attention", "full_attention"] * 2})}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def _hf_model(family: str, tied: bool) -> torch.nn.Module:
    import transformers

    config_class, model_class, extra = CLASSES[family]
    config = getattr(transformers, config_class)(**TINY, **extra, tie_word_embeddings=tied)
    torch.manual_seed(0)
    return getattr(transformers, model_class)(config).float()


def hf_pp_body(pp: int, microbatches: int) -> dict[str, tuple[float, float, int]]:
    from transformers.utils import logging

    logging.set_verbosity_error()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, TINY["vocab_size"], (2 * microbatches, 12), generator=g)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    results = {}
    for family, extra, tied in CASES:
        full = _hf_model(family, tied)
        reference = copy.deepcopy(full)
        ref_loss = reference(**batch).loss
        ref_loss.backward()
        ref = dict(reference.named_parameters(remove_duplicate=False))
        model = NxDPPModel(full, pp, {"num_microbatches": microbatches, **extra})
        loss = model.run_train(**batch)
        worst, checked = 0.0, 0
        for name, param in model.local_module().named_parameters(remove_duplicate=False):
            worst = max(worst, _rel(param.grad, ref[name].grad))
            checked += 1
        key = f"{family}{'/tied' if tied else ''}/{extra or 'auto'}"
        results[key] = (_rel(loss, ref_loss.detach()), worst, checked, model.stage_bounds)
    return results


@pytest.mark.slow
def test_hf_decoder_lms_pipeline_split_match_one_process(rank_pool):
    per_rank = rank_pool(2).run(hf_pp_body, 2, 2)
    for key in per_rank[0]:
        loss_diff = max(r[key][0] for r in per_rank)
        grad_diff = max(r[key][1] for r in per_rank)
        print(f"{key}: stages {per_rank[0][key][3]}, loss rel diff {loss_diff:.2e}, grad rel diff {grad_diff:.2e}")
        assert loss_diff <= 1e-5 and grad_diff <= 1e-5, key
        family, tied = key.split("/")[0], "/tied" in key
        total = len(list(_hf_model(family, tied).named_parameters(remove_duplicate=False)))
        assert sum(r[key][2] for r in per_rank) >= total, key  # every parameter checked on some rank
    assert [list(b) for b in per_rank[0]["llama/tied/{'pipeline_cuts': ['model.layers.0']}"][3]] == [[0], [1, 2, 3]]


def test_a_model_of_another_shape_is_refused_with_the_contract():
    with pytest.raises(ConfigError, match="not shaped like a Hugging Face decoder-only LM"):
        model_layout(torch.nn.Sequential(torch.nn.Linear(2, 2)))


def test_an_hf_moe_lm_with_its_router_loss_is_refused():
    """Each stage would see only its own layers' router logits: HF's all-layer aux loss cannot be
    computed, so the adapter refuses it (without the loss, the model is an ordinary decoder LM)."""
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(vocab_size=32, hidden_size=16, intermediate_size=16, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, num_local_experts=2,
                           output_router_logits=True)
    with pytest.raises(ConfigError, match=r"output_router_logits=True.*'mixtral'"):
        model_layout(MixtralForCausalLM(config))
    config.output_router_logits = False
    assert model_layout(MixtralForCausalLM(config))["layers"] == "model.layers"
