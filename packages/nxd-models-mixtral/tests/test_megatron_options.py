"""The Megatron options of NxDT's megatron_mixtral configs: vocabulary padding
(``make_vocab_size_divisible_by``) is invisible in logits, loss and HF export (TP=1 and TP=2, where
rank 1 holds padding rows), and ``use_scaled_init_method`` scales the output projections' init."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from nxd.transforms import parallelize_model

sys.path.insert(0, str(Path(__file__).parent))
from mixtral_test_utils import VOCAB, batch, hf_reference, quiet_transformers, rel_err, save_hf  # noqa: E402

quiet_transformers()

DIVISIBLE_BY = 48  # vocabulary 128 -> 144 rows at TP=1, 192 at TP=2 (rank 1: 32 real rows, 64 padding)


def padded_body(hf_dir: str, data: dict[str, torch.Tensor], out_dir: str) -> dict | None:
    """Import ``hf_dir`` with vocabulary padding, forward/backward, export to ``out_dir``; rank 0
    returns the full logits (padded columns included), loss, HF-named grads and the padded size."""
    import torch.distributed as dist

    from nxd_models_llama import gather_vocab_logits
    from nxd_models_mixtral import MixtralConfig, MixtralForCausalLM, collect_hf_state_dict, load_hf_checkpoint
    from nxd_models_mixtral.hf_io import save_hf_checkpoint

    config = MixtralConfig.from_dict({**json.loads((Path(hf_dir) / "config.json").read_text()),
                                      "make_vocab_size_divisible_by": DIVISIBLE_BY})
    model = parallelize_model(MixtralForCausalLM(config))
    load_hf_checkpoint(model, hf_dir)
    save_hf_checkpoint(model, out_dir)
    out = model(data["input_ids"], labels=data["labels"])
    out.loss.backward()
    logits = gather_vocab_logits(out.logits).detach()
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.grad.detach().clone()
    grads = collect_hf_state_dict(model)
    if dist.is_initialized() and dist.get_rank() != 0:
        return None
    return {"logits": logits, "loss": out.loss.detach(), "grads": grads, "padded": model.padded_vocab_size}


def _check(result: dict, ref: dict, src: Path, out_dir: Path, padded: int) -> float:
    from safetensors.torch import load_file

    assert result["padded"] == padded and result["logits"].shape[-1] == padded
    assert torch.all(result["logits"][..., VOCAB:] == float("-inf"))  # no probability (nxd_tensor_parallel.vocab_padding)
    errors = [rel_err(result["logits"][..., :VOCAB], ref["logits"]), rel_err(result["loss"], ref["loss"])]
    assert set(result["grads"]) == set(ref["grads"])
    errors += [rel_err(result["grads"][k], g) for k, g in ref["grads"].items()]
    assert max(errors) <= 1e-5, max(errors)
    a, b = load_file(str(src / "model.safetensors")), load_file(str(out_dir / "model.safetensors"))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)  # export drops the padding
    assert "make_vocab_size_divisible_by" not in json.loads((out_dir / "config.json").read_text())
    return max(errors)


@pytest.mark.slow  # starts a 2-rank pool: 124 s on the shared box (load ~13)
def test_vocab_padding_is_hidden_at_tp1_and_tp2(rank_pool, tmp_path):
    src = save_hf(tmp_path / "hf", seed=8)
    data = batch(seed=9)
    ref = hf_reference(src, data)
    worst1 = _check(padded_body(str(src), data, str(tmp_path / "out1")), ref, src, tmp_path / "out1", 144)
    tp2 = rank_pool(2).run(_tp2_padded_body, str(src), data, str(tmp_path / "out2"), timeout=600)[0]
    worst2 = _check(tp2, ref, src, tmp_path / "out2", 192)
    print(f"\nvocabulary padding: worst relative error TP=1 {worst1:.3g}, TP=2 {worst2:.3g}")


def _tp2_padded_body(hf_dir: str, data: dict[str, torch.Tensor], out_dir: str) -> dict | None:
    from nxd_core_parallel import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    return padded_body(hf_dir, data, out_dir)


def test_scaled_init_method_scales_the_output_projections():
    from nxd_models_mixtral import MixtralConfig, MixtralForCausalLM

    base = dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, initializer_range=0.1)
    torch.manual_seed(0)
    scaled = parallelize_model(MixtralForCausalLM(MixtralConfig.from_dict({**base, "use_scaled_init_method": True})))
    layer = scaled.model.layers[1]
    expected = 0.1 / (2 * 2) ** 0.5  # Megatron: init_method_std / sqrt(2 * num_layers)
    assert abs(layer.self_attn.o_proj.weight.std().item() / expected - 1) < 0.1
    assert abs(layer.block_sparse_moe.experts.down_proj.std().item() / expected - 1) < 0.1
    assert abs(layer.block_sparse_moe.experts.gate_up_proj.std().item() / 0.1 - 1) < 0.1  # inputs: unscaled
    torch.manual_seed(0)
    plain = parallelize_model(MixtralForCausalLM(MixtralConfig.from_dict(base)))
    assert abs(plain.model.layers[1].self_attn.o_proj.weight.std().item() / 0.1 - 1) < 0.1
