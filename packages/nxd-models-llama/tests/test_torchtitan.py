"""torchtitan's Llama 3 names (nxd_models_llama.torchtitan): an nxd Llama's weights written as a DCP
checkpoint under torchtitan's names come back bit-exact, and the renamed, re-ordered ``wq``/``wk``
give, under torchtitan's interleaved (complex) RoPE, the attention scores nxd's weights give under
Hugging Face's half-rotation RoPE (the reason for the row order). One process; torchtitan itself is
not installed, its RoPE is restated here from its definition."""

from __future__ import annotations

import torch
import torch.distributed.checkpoint as dcp

from nxd.transforms import parallelize_model
from nxd_models_llama import LlamaConfig, LlamaForCausalLM
from nxd_models_llama.torchtitan import from_torchtitan, nxd_to_hf, to_torchtitan

CONFIG = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0)
TORCHTITAN_KEYS = {"tok_embeddings.weight", "norm.weight", "output.weight"} | {
    f"layers.{i}.{k}.weight" for i in range(2) for k in (
        "attention.wq", "attention.wk", "attention.wv", "attention.wo", "feed_forward.w1", "feed_forward.w2",
        "feed_forward.w3", "attention_norm", "ffn_norm")}


def _model() -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    config = LlamaConfig.from_dict(dict(CONFIG))
    return config, {k: v.detach().clone() for k, v in parallelize_model(LlamaForCausalLM(config)).state_dict().items()}


def test_dcp_round_trip_under_torchtitan_names(tmp_path):
    config, state = _model()
    titan = to_torchtitan(state, config)
    assert set(titan) == TORCHTITAN_KEYS
    dcp.save(titan, checkpoint_id=str(tmp_path / "ckpt"))  # one process: DCP without a process group
    loaded = {k: torch.zeros_like(v) for k, v in titan.items()}
    dcp.load(loaded, checkpoint_id=str(tmp_path / "ckpt"))
    back = from_torchtitan(loaded, config, list(state))
    assert back.keys() == state.keys()
    assert all(torch.equal(back[k], state[k]) for k in state)


def _hf_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Hugging Face / nxd: rotate dims i and i + d/2 (``rotate_half``). x: [seq, heads, d]."""
    d = x.shape[-1]
    freqs = torch.outer(positions.double(), 1.0 / theta ** (torch.arange(0, d, 2).double() / d))
    cos, sin = torch.cat([freqs, freqs], -1).cos()[:, None], torch.cat([freqs, freqs], -1).sin()[:, None]
    rotated = torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1)
    return x * cos + rotated * sin


def _torchtitan_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """torchtitan: dims 2i and 2i+1 are one complex number, multiplied by e^(i * pos * theta^(-2i/d))."""
    d = x.shape[-1]
    freqs = torch.outer(positions.double(), 1.0 / theta ** (torch.arange(0, d, 2).double() / d))
    pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(pairs * torch.polar(torch.ones_like(freqs), freqs)[:, None]).flatten(-2)


def test_torchtitan_rope_on_mapped_weights_gives_the_same_attention_scores():
    config, state = _model()
    hf, titan = nxd_to_hf(state, config), to_torchtitan(state, config)
    x, positions = torch.randn(7, config.hidden_size, dtype=torch.float64), torch.arange(7)
    d, theta = config.head_dim, config.rope_theta
    kv_repeat = config.num_attention_heads // config.num_key_value_heads

    def scores(wq: torch.Tensor, wk: torch.Tensor, rope) -> torch.Tensor:
        q = rope((x @ wq.double().T).view(7, -1, d), positions, theta)
        k = rope((x @ wk.double().T).view(7, -1, d), positions, theta).repeat_interleave(kv_repeat, dim=1)
        return torch.einsum("qhd,khd->hqk", q, k)

    for layer in range(config.num_hidden_layers):
        want = scores(hf[f"model.layers.{layer}.self_attn.q_proj.weight"],
                      hf[f"model.layers.{layer}.self_attn.k_proj.weight"], _hf_rope)
        got = scores(titan[f"layers.{layer}.attention.wq.weight"], titan[f"layers.{layer}.attention.wk.weight"],
                     _torchtitan_rope)
        assert torch.allclose(got, want, rtol=1e-12, atol=1e-12), (got - want).abs().max()
        # without the row order the scores differ: the re-ordering is needed, not incidental
        plain = scores(hf[f"model.layers.{layer}.self_attn.q_proj.weight"],
                       hf[f"model.layers.{layer}.self_attn.k_proj.weight"], _torchtitan_rope)
        assert not torch.allclose(plain, want, rtol=1e-6, atol=1e-6)
