"""The registered ``llama`` ModelSpec, configs/presets, activation checkpointing and generate()."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from nxd.transforms import parallelize_model

sys.path.insert(0, str(Path(__file__).parent))
from llama_test_utils import CONFIGS, batch, quiet_transformers, save_hf  # noqa: E402

import nxd  # noqa: E402
from nxd_models_llama import (  # noqa: E402
    PRESETS,
    LlamaConfig,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
    generate,
    load_hf_checkpoint,
)

quiet_transformers()


def test_spec_is_registered_and_builds_from_hf_config(tmp_path):
    spec = nxd.get_model("llama")
    assert spec.transformer_layer_classes == (LlamaDecoderLayer,)
    assert LlamaForCausalLM.nxd_transformer_layer_classes == (LlamaDecoderLayer,)
    assert set(spec.lora_target_modules) <= set(spec.extras["hf_module_to_nxd"])
    hf_dir = save_hf("gqa", tmp_path / "gqa")
    import json

    config = spec.config_from_dict(json.loads((hf_dir / "config.json").read_text()))
    model = nxd.build_parallel_model(spec, config, nxd.neuronx_distributed_config(sequence_parallel=False))
    spec.load_hf(model, str(hf_dir))
    spec.save_hf(model, str(tmp_path / "out"))
    assert (tmp_path / "out" / "model.safetensors").is_file()
    names = dict(model.named_modules())
    for hf_name, (nxd_suffix, _) in spec.extras["hf_module_to_nxd"].items():
        assert any(n.endswith(nxd_suffix) for n in names), (hf_name, nxd_suffix)


def test_config_accepts_transformers4_keys_and_aliases():
    v4 = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 96,
          "vocab_size": 128, "rope_theta": 500000.0, "torch_dtype": "bfloat16",
          "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 8192}}
    c = LlamaConfig.from_dict(v4)
    assert (c.rope_type, c.rope_theta, c.num_key_value_heads, c.head_dim, c.dtype) == ("llama3", 500000.0, 4, 16,
                                                                                        "bfloat16")
    alias = LlamaConfig.from_dict({"num_layers": 3, "num_kv_heads": 2, "ffn_hidden_size": 96, "hidden_size": 64,
                                   "num_attention_heads": 4, "vocab_size": 128})
    assert (alias.num_hidden_layers, alias.num_key_value_heads, alias.intermediate_size) == (3, 2, 96)
    with pytest.raises(nxd.ConfigError, match="num_layers=3 conflicts with num_hidden_layers=2"):
        LlamaConfig.from_dict({"num_layers": 3, "num_hidden_layers": 2})
    assert nxd.get_model("llama").config_from_dict({"preset": "llama3-8b", "num_hidden_layers": 2}).num_hidden_layers == 2


# Published parameter counts (model cards) minus embedding and norm weights = matmul parameters.
@pytest.mark.parametrize("name,total", [("llama3-8b", 8_030_261_248), ("llama2-7b", 6_738_415_616),
                                        ("llama3-70b", 70_553_706_496), ("llama2-13b", 13_015_864_320)])
def test_presets_match_published_sizes(name, total):
    spec = nxd.get_model("llama")
    c = spec.config_from_dict(PRESETS[name])
    non_matmul = c.vocab_size * c.hidden_size + (2 * c.num_hidden_layers + 1) * c.hidden_size
    assert spec.flops_per_token(c) == 6 * (total - non_matmul)
    assert spec.flops_per_token(c, seq_length=2048) > spec.flops_per_token(c)


def test_llama31_preset_rope_matches_transformers():
    from transformers import LlamaConfig as HFConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = LlamaConfig.from_dict(PRESETS["llama3.1-8b"])
    hf = HFConfig(**{k: v for k, v in PRESETS["llama3.1-8b"].items()})
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")
    assert torch.equal(rope_inv_freq(cfg), expected)


def rope_inv_freq(config: LlamaConfig) -> torch.Tensor:
    """The shared RoPE's inverse frequencies for a Llama config."""
    from nxd_modeling.rotary import rope_frequencies

    return rope_frequencies(config.head_dim, config.rope_theta, config.rope_scaling, config.max_position_embeddings)[0]


#: YaRN as published: Qwen3's long-context recipe, DeepSeek-V3's (mscale = mscale_all_dim: attention
#: factor 1), and every optional key set (explicit attention_factor, betas, no truncation)
YARN_CASES = {
    "qwen3": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, 131072, 128),
    "deepseek_v3": ({"type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32,
                     "beta_slow": 1, "original_max_position_embeddings": 4096}, 163840, 64),
    "all_keys": ({"rope_type": "yarn", "factor": 8.0, "attention_factor": 0.9, "beta_fast": 16, "beta_slow": 2,
                  "truncate": False, "original_max_position_embeddings": 4096}, 32768, 32),
}


@pytest.mark.parametrize("case", list(YARN_CASES))
def test_llama_yarn_rope_matches_transformers_bitwise(case):
    """The shared RoPE (nxd_modeling.rotary) that every family uses: YaRN's inverse
    frequencies equal transformers' bit for bit, and cos/sin carry its attention factor."""
    from transformers import LlamaConfig as HFConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling, max_positions, head_dim = YARN_CASES[case]
    fields = dict(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim, max_position_embeddings=max_positions,
                  rope_theta=10000.0)
    cfg = LlamaConfig.from_dict({**fields, "intermediate_size": 8, "num_hidden_layers": 1, "rope_scaling": dict(scaling)})
    expected, factor = ROPE_INIT_FUNCTIONS["yarn"](HFConfig(**fields, rope_scaling=dict(scaling)), "cpu")
    assert torch.equal(rope_inv_freq(cfg), expected)
    cos, _ = LlamaModel(cfg, device="meta").rotary_emb(torch.zeros(1, 1, dtype=torch.long), torch.float32)
    assert torch.allclose(cos, torch.full_like(cos, factor), rtol=0, atol=1e-7)


def test_activation_checkpointing_keeps_loss_and_grads(tmp_path):
    from nxd_core_parallel.activation_checkpoint import apply_activation_checkpointing

    hf_dir = save_hf("gqa", tmp_path / "gqa")
    data = batch()
    grads = []
    for checkpointed in (False, True):
        model = parallelize_model(LlamaForCausalLM(LlamaConfig.from_dict(CONFIGS["gqa"])))
        if checkpointed:
            assert apply_activation_checkpointing(model, model.nxd_transformer_layer_classes) == 2
        load_hf_checkpoint(model, hf_dir)
        model(**data).loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    assert all(torch.equal(grads[0][n], grads[1][n]) for n in grads[0])


def test_nxdt_recompute_names_keep_loss_and_grads(tmp_path):
    """Every NxD Training recompute name the spec maps (CoreAttention, LlamaMLP, LlamaRMSNorm,
    ActivationMultiplyMLP, ...) selects modules of the built model, and recomputing them changes nothing."""
    from nxd_core_parallel.activation_checkpoint import apply_activation_checkpointing

    hf_dir = save_hf("gqa", tmp_path / "gqa")
    data = batch()
    reference = parallelize_model(LlamaForCausalLM(LlamaConfig.from_dict(CONFIGS["gqa"])))
    load_hf_checkpoint(reference, hf_dir)
    reference(**data).loss.backward()
    spec = nxd.get_model("llama")
    assert {"CoreAttention", "LlamaMLP", "LlamaRMSNorm", "ActivationMultiplyMLP"} <= set(spec.recompute_modules)
    for name, classes in spec.recompute_modules.items():
        model = parallelize_model(LlamaForCausalLM(LlamaConfig.from_dict(CONFIGS["gqa"])))
        assert apply_activation_checkpointing(model, classes) >= 2, name  # at least one per layer
        load_hf_checkpoint(model, hf_dir)
        model(**data).loss.backward()
        for n, p in model.named_parameters():
            assert torch.equal(p.grad, dict(reference.named_parameters())[n].grad), (name, n)


def _tiny_model(tmp_path: Path) -> LlamaForCausalLM:
    model = parallelize_model(LlamaForCausalLM(LlamaConfig.from_dict(CONFIGS["llama3_rope"])))
    load_hf_checkpoint(model, save_hf("llama3_rope", tmp_path / "m"))
    return model


def test_generate_cache_eos_and_sampling(tmp_path):
    model = _tiny_model(tmp_path)
    prompt = batch()["input_ids"][:, :4]
    greedy = generate(model, prompt, 12)
    assert greedy.shape == (2, 16) and greedy[:, :4].equal(prompt)
    assert generate(model, prompt, 12, use_cache=False).equal(greedy)
    # eos: the first greedy token of row 0 ends that row, which is then padded with eos
    eos = int(greedy[0, 4])
    stopped = generate(model, prompt, 12, eos_token_id=eos)
    assert (stopped[0, 4:] == eos).all()
    # sampling: reproducible with a seeded generator, and top_k=1 is greedy
    a = generate(model, prompt, 8, do_sample=True, generator=torch.Generator().manual_seed(5))
    b = generate(model, prompt, 8, do_sample=True, generator=torch.Generator().manual_seed(5), use_cache=False)
    assert a.equal(b)
    assert generate(model, prompt, 8, do_sample=True, top_k=1, temperature=0.7).equal(greedy[:, :12])
    with pytest.raises(ValueError, match="temperature"):
        generate(model, prompt, 2, do_sample=True, temperature=0.0)


def test_meta_device_init_through_initialize_parallel_model(tmp_path):
    """Built on the meta device by nxd's facade, materialised, then loaded: same loss as eager."""
    hf_dir = save_hf("llama3_rope", tmp_path / "m")
    config = LlamaConfig.from_dict(CONFIGS["llama3_rope"])
    nxd_config = nxd.neuronx_distributed_config(
        model_init_config={"meta_device_init": True, "param_init_fn": LlamaForCausalLM.init_weights})
    wrapped = nxd.initialize_parallel_model(nxd_config, nxd.get_model("llama").build, False, config, nxd_config)
    load_hf_checkpoint(wrapped, hf_dir)
    eager = parallelize_model(LlamaForCausalLM(config))
    load_hf_checkpoint(eager, hf_dir)
    data = batch()
    assert torch.equal(wrapped(**data).loss, eager(**data).loss)


def test_kv_replication_factor_and_invalid_tp():
    from nxd_models_llama.modeling import kv_size_multiplier_for

    gqa = LlamaConfig.from_dict({**CONFIGS["gqa"], "num_attention_heads": 8, "hidden_size": 64})
    assert [kv_size_multiplier_for(gqa, tp) for tp in (1, 2, 4, 8)] == [1, 1, 2, 4]
    six = LlamaConfig.from_dict({**CONFIGS["gqa"], "num_attention_heads": 12, "num_key_value_heads": 6,
                                 "hidden_size": 96})
    assert kv_size_multiplier_for(six, 4) == 2  # 6 KV heads replicated twice over 4 TP ranks, as NxD does
    # 12 query heads at TP=8 are padded (NxD's pad_model): two zero KV groups of 2 -> 16 heads, 1 group per rank
    assert kv_size_multiplier_for(six, 8) == 1
