"""nxd-torchtitan without torchtitan: ``nxd ckpt convert`` to torchtitan's layout and back is
bit-exact for Llama 3 (RoPE rows re-ordered, scaled RoPE, untied) and Qwen3 (q/k norms, tied head),
a <= 0.2-named folder reads the same, and models torchtitan cannot express are refused naming the
field. torchtitan's own code on the other side: the ``interop`` nox session (integration_tests/interop/)."""

from __future__ import annotations

import json

import pytest
import torch

import nxd
from nxd_ckpt.convert import run_convert, single_rank
from nxd_ckpt.dcp_folder import read_dcp_tensors, write_dcp_folder
from nxd_ckpt.errors import CheckpointError
from nxd_torchtitan.model_args import TitanArgs, ffn_hidden_dim, from_nxd_config, to_nxd_config

LLAMA = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=500000.0,
             rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 32})
QWEN3 = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=1e6,
             tie_word_embeddings=True)


def _state(name: str, config: dict) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    with single_rank() as context:
        model = nxd.build_parallel_model(nxd.get_model(name), config, context=context)
        with torch.no_grad():  # norms start at 1: make every tensor distinct so a swap shows
            for p in model.parameters():
                p.normal_()
        return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("name,config", [("llama", LLAMA), ("qwen3", QWEN3)])
def test_round_trip_through_torchtitan_layouts(tmp_path, name, config):
    state = _state(name, config)
    torch.save(state, tmp_path / "full.pt")
    (tmp_path / "config.json").write_text(json.dumps(config))
    run_convert("full", "torchtitan", str(tmp_path / "full.pt"), str(tmp_path / "titan"), model=name,
                config_path=str(tmp_path / "config.json"))
    titan = read_dcp_tensors(str(tmp_path / "titan"))
    assert "layers.1.attention.qkv_linear.wq.weight" in titan and "lm_head.weight" in titan
    assert ("layers.0.attention.q_norm.weight" in titan) == (name == "qwen3")
    if name == "qwen3":  # tied: torchtitan's state dict holds the head under both names
        assert torch.equal(titan["lm_head.weight"], titan["tok_embeddings.weight"])
    args = json.loads((tmp_path / "titan" / "nxd_torchtitan.json").read_text())
    assert args["family"] == name and args["norm_eps"] == config["rms_norm_eps"]

    full = run_convert("torchtitan", "full", str(tmp_path / "titan"), str(tmp_path / "back.pt"))
    assert full.model == name and full.state.keys() == state.keys()
    assert all(torch.equal(full.state[k], state[k]) for k in state)

    # torchtitan <= 0.2's names (attention.wq, output) in a training checkpoint's step folder
    old = {k.replace("attention.qkv_linear.", "attention.").replace("lm_head.", "output."): v for k, v in titan.items()}
    old["optimizer.state.tok_embeddings.weight.exp_avg"] = torch.zeros(1)
    write_dcp_folder(str(tmp_path / "run" / "checkpoint" / "step-7"), old)
    (tmp_path / "args.json").write_text(json.dumps(args))
    full = run_convert("torchtitan", "full", str(tmp_path / "run" / "checkpoint"), str(tmp_path / "old.pt"),
                       config_path=str(tmp_path / "args.json"))
    assert all(torch.equal(full.state[k], state[k]) for k in state)


def test_llama_rope_rows_are_interleaved():
    """Row 2i + j of a torchtitan Llama head is row i + j * head_dim / 2 of nxd's (HF's) head; Qwen3's
    (CosSinRoPE, halves) keep nxd's order."""
    from nxd_torchtitan.convert import to_torchtitan_state

    for name, config, reordered in (("llama", LLAMA, True), ("qwen3", QWEN3, False)):
        state = _state(name, config)
        titan, args = to_torchtitan_state(name, config, state)
        wq = state["model.layers.0.self_attn.qkv_proj.weight_qkv"][:args.n_heads * args.head_dim]
        tq, hd = titan["layers.0.attention.qkv_linear.wq.weight"], args.head_dim
        rows = [0, hd // 2, 1, hd // 2 + 1] if reordered else [0, 1, 2, 3]
        assert torch.equal(tq[:4], wq[rows]) and torch.equal(tq[hd:hd + 4], wq[[hd + r for r in rows]])


def test_config_maps_both_ways_and_refuses_what_torchtitan_cannot_express():
    for name, config in (("llama", LLAMA), ("qwen3", QWEN3)):
        args = from_nxd_config(name, config)
        assert from_nxd_config(name, to_nxd_config(args)) == args
    args = from_nxd_config("llama", LLAMA)
    assert args.rope_scaling == {"scaling_factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 32}
    assert (args.norm_eps, args.hidden_dim, args.enable_weight_tying) == (1e-5, 48, False)
    refused = {
        ("llama", "attention_bias"): dict(LLAMA, attention_bias=True),
        ("llama", "rope_scaling.rope_type"): dict(LLAMA, rope_scaling={"rope_type": "linear", "factor": 2.0}),
        ("llama", "head_dim"): dict(LLAMA, head_dim=16),
        ("qwen3", "rope_scaling.rope_type"): dict(QWEN3, rope_scaling=LLAMA["rope_scaling"]),
    }
    for (name, key), config in refused.items():
        with pytest.raises(ValueError, match=key):
            from_nxd_config(name, config)
    # torchtitan <= 0.2 ModelArgs: FFN width from multiple_of / ffn_dim_multiplier, use_scaled_rope
    old = TitanArgs.from_dict({"family": "llama", "dim": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8,
                               "vocab_size": 128256, "multiple_of": 1024, "ffn_dim_multiplier": 1.3,
                               "norm_eps": 1e-5, "rope_theta": 500000, "max_seq_len": 131072,
                               "use_scaled_rope": True})
    assert old.hidden_dim == 14336 == ffn_hidden_dim(4096, 1024, 1.3) and old.head_dim == 128
    assert old.rope_scaling["scaling_factor"] == 8.0
    with pytest.raises(ValueError, match="moe_dim"):
        TitanArgs.from_dict({**old.to_dict(), "moe_dim": 3})


def test_torchtitan_source_needs_the_model(tmp_path):
    write_dcp_folder(str(tmp_path / "step-1"), {"tok_embeddings.weight": torch.zeros(2, 2)})
    with pytest.raises(CheckpointError, match="do not record the model"):
        run_convert("torchtitan", "full", str(tmp_path / "step-1"), str(tmp_path / "out.pt"))
