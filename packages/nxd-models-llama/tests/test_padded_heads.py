"""Query heads TP does not divide (NxD's ``pad_model``) in Llama: 6 query heads over 2 KV heads at
TP=4 are padded to 8 inside their KV groups (each group 3 real + 1 zero head, K/V replicated twice;
ranks 1 and 3 hold one real and one zero head), and 5 heads (MHA) at TP=2 to 6 by one zero group.
The attention zeroes the padded heads' output, so the model is the unpadded one (sequence
parallel at TP=4). Oracle:
transformers (loss, every gradient after nxd's sync, the gradient norm, within 1e-5 relative: fp32
sums of a few hundred terms, as in the unpadded parity tests); the padding gets exactly zero gradient; the HF
export is byte-equal to its source, reloads with the same logits and generates the same tokens; an
nxd checkpoint saved padded at TP=2 loads at TP=1 with exactly the HF-imported tensors (a tag NxD
wrote, which does not record how it padded, is refused at a padded TP)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from llama_test_utils import CONFIGS, batch, quiet_transformers, save_hf  # noqa: E402

from nxd_testing.reference import assert_export_roundtrip, hf_lm_reference, parallel_grads_body
from nxd_testing.reference import assert_parallel_parity as check

quiet_transformers()
CONFIGS["gqa6"] = dict(CONFIGS["mha"], hidden_size=48, num_attention_heads=6, num_key_value_heads=2)
CONFIGS["mha5"] = dict(CONFIGS["mha"], hidden_size=40, num_attention_heads=5, num_key_value_heads=5,
                       attention_bias=True)
EXPORT = "nxd_models_llama:collect_hf_state_dict"


def test_padded_layouts():
    from nxd_tensor_parallel.modules.kv_heads import head_padding_for

    gqa, mha, nxd_example = head_padding_for(6, 2, 4), head_padding_for(5, 5, 2), head_padding_for(48, 8, 32)
    assert (gqa.group_slots, gqa.kv_groups, gqa.kv_size_multiplier(4)) == (4, 2, 2)
    assert [gqa.heads_of_rank(4, r)[0] for r in range(4)] == [[0, 1], [2, None], [3, 4], [5, None]]
    assert (mha.padded_heads, mha.kv_groups, mha.kv_size_multiplier(2)) == (6, 6, 1)
    assert mha.heads_of_rank(2, 1) == ([3, 4, None], [3, 4, None])
    assert nxd_example.padded_heads == 64  # NxD's generate_padding_mask docstring: 48 heads at TP=32 -> 64
    assert not head_padding_for(8, 2, 4).padded
    real = torch.randn(6 * 3 + 2 * 2 * 3, 5)  # [q; k; v] of 3-row heads
    padded = gqa.pad(real, 0, 3, kv=True)
    assert padded.shape[0] == 8 * 3 + 2 * 2 * 3 and torch.equal(gqa.unpad(padded, 0, 3, kv=True), real)
    assert padded[9:12].abs().sum() == 0  # group 0's 4th slot


def test_lora_on_padded_attention_is_refused():
    import nxd
    from nxd_models_llama import LlamaForCausalLM
    from nxd_models_llama.spec import hf_param_plan

    model = LlamaForCausalLM(dict(CONFIGS["gqa6"], num_hidden_layers=1))
    assert len(hf_param_plan(model, "model.layers.0.self_attn.qkv_proj.weight_qkv", 4, 0)) == 3  # rank 0: real heads
    with pytest.raises(nxd.ConfigError, match="padded at tensor_parallel_size 4"):
        hf_param_plan(model, "model.layers.0.self_attn.qkv_proj.weight_qkv", 4, 1)


def heads_body(src: str, out: str, prompt: torch.Tensor) -> dict:
    """At TP=4: the export round trip, and the zero heads' weights and their gradients."""
    from nxd_core_parallel import parallel_state
    from nxd_testing.reference import build_from_hf

    context = parallel_state.initialize_model_parallel(tensor_model_parallel_size=4)
    spec, model = build_from_hf("llama", src)
    attn = model.model.layers[0].self_attn
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(3))
    model(ids, labels=ids).loss.backward()
    hd, rank = attn.head_dim, context.tp.rank
    qkv, o = attn.qkv_proj.weight_qkv, attn.o_proj.weight
    padding = []  # local q head 1 is padding on ranks 1 and 3: its weights and their gradients
    if rank % 2:
        padding = [float(t.abs().max()) for t in (qkv[hd:2 * hd], qkv.grad[hd:2 * hd], o[:, hd:2 * hd],
                                                  o.grad[:, hd:2 * hd])]
    model.zero_grad()
    assert_export_roundtrip(spec, model, src, out, prompt, 4)
    layout = (attn.num_heads, attn.num_kv_heads, attn.kv_size_multiplier, attn.real_heads)
    parallel_state.destroy_model_parallel()
    return {"padding": padding, "layout": layout}


def reshard_body(src: str, root: str) -> tuple[list[str], str]:
    """Saved padded at TP=2 (x DP=2), loaded at TP=1: the tensors that differ from the HF import at
    TP=1; and the refusal of the same shards written as NxD writes them (no metadata.json)."""
    import nxd
    from nxd.transforms import parallelize_model
    from nxd_ckpt import CheckpointError
    from nxd_core_parallel import parallel_state
    from nxd_models_llama import LlamaForCausalLM, load_hf_checkpoint

    config = json.loads((Path(src) / "config.json").read_text())
    context = parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    model = parallelize_model(LlamaForCausalLM(config))
    load_hf_checkpoint(model, src)
    nxd.save_checkpoint(root, "tp2", model=model)
    if context.dp.rank == 0:
        (Path(root) / "nxd" / "model").mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), Path(root) / "nxd" / "model" / f"dp_rank_00_tp_rank_{context.tp.rank:02d}_pp_rank_00.pt")
    torch.distributed.barrier()
    with pytest.raises(CheckpointError, match="written by NxD") as refused:
        nxd.load_checkpoint(root, "nxd", model=model)
    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    expected = parallelize_model(LlamaForCausalLM(config))
    load_hf_checkpoint(expected, src)
    torch.manual_seed(9)
    single = parallelize_model(LlamaForCausalLM(config))
    nxd.load_checkpoint(root, "tp2", model=single)
    want = expected.state_dict()
    parallel_state.destroy_model_parallel()
    return [k for k, v in single.state_dict().items() if not torch.equal(v, want[k])], str(refused.value)


@pytest.mark.slow
def test_llama_heads_tp_does_not_divide_are_padded(rank_pool, tmp_path):
    gqa, mha = save_hf("gqa6", tmp_path / "gqa6", seed=2), save_hf("mha5", tmp_path / "mha5", seed=3)
    data = batch(seed=4)
    pool = rank_pool(4)
    worst = {"gqa6 tp4 sp": check(pool.run(parallel_grads_body, 4, 1, "llama", EXPORT, str(gqa), data, True)[0],
                                  hf_lm_reference(gqa, data)),
             "mha5 tp2 dp2": check(pool.run(parallel_grads_body, 2, 1, "llama", EXPORT, str(mha), data)[0],
                                   hf_lm_reference(mha, data, shards=2))}
    print(f"\npadded query heads vs transformers (worst relative error): {worst}")
    out = pool.run(heads_body, str(gqa), str(tmp_path / "out"), data["input_ids"][:1, :4])
    assert [r["layout"] for r in out] == [(2, 1, 2, None), (2, 1, 2, (True, False))] * 2
    assert out[1]["padding"] == [0.0] * 4 and out[3]["padding"] == [0.0] * 4  # zero and no gradient
    for differ, refused in pool.run(reshard_body, str(mha), str(tmp_path / "ckpt")):
        assert differ == [] and "pads its attention heads at TP=2" in refused
