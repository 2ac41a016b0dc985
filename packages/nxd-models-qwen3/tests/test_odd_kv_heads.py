"""Odd KV-head counts in Qwen3 and Qwen3-MoE (the Llama and Mixtral attention code): 6 query heads over
3 KV heads at TP=2, K/V replicated on both ranks (NxD's ``kv_size_multiplier`` 2), each local query
head attending to its HF group's KV head; the per-head q/k norms see replicated K heads. Oracle:
transformers (loss, every gradient after nxd's sync, the gradient norm); the HF export at TP=2 is
byte-equal to its source and greedy generation matches transformers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from qwen3_test_utils import batch, build_from_hf, hf_reference, save_hf  # noqa: E402

from nxd_testing.reference import assert_export_roundtrip, parallel_grads_body, quiet_transformers
from nxd_testing.reference import assert_parallel_parity as check

quiet_transformers()
ODD = dict(num_attention_heads=6, num_key_value_heads=3, head_dim=8)


def export_body(src: str, out: str, prompt) -> int:
    from nxd_core_parallel import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    spec, model = build_from_hf(src)
    multiplier = model.model.layers[0].self_attn.kv_size_multiplier
    assert_export_roundtrip(spec, model, src, out, prompt, 4)
    parallel_state.destroy_model_parallel()
    return multiplier


@pytest.mark.slow
def test_qwen3_dense_and_moe_three_kv_heads_at_tp2(rank_pool, tmp_path):
    pool = rank_pool(2)
    worst = {}
    for name, moe, export in (("qwen3", False, "nxd_models_llama:collect_hf_state_dict"),
                              ("qwen3_moe", True, "nxd_models_mixtral:collect_hf_state_dict")):
        src = save_hf(tmp_path / name, moe=moe, seed=5, **ODD)
        data = batch(seed=6)
        got = pool.run(parallel_grads_body, 2, 1, name, export, str(src), data, timeout=600)[0]
        worst[name] = check(got, hf_reference(src, data))
        if not moe:
            assert pool.run(export_body, str(src), str(tmp_path / "out"), data["input_ids"][:1, :4]) == [2, 2]
    print(f"\n3 KV heads at TP=2 vs transformers: {worst}")


@pytest.mark.slow
def test_qwen3_dense_and_moe_query_heads_tp_does_not_divide_are_padded(rank_pool, tmp_path):
    """NxD's pad_model at TP=2 through Llama's and Mixtral's attention, per-head q/k norms included:
    Qwen3 with 3 query heads over 1 KV head (padded inside the group to 4, K/V on both ranks) and
    Qwen3-MoE with 3 heads (MHA: padded by one zero group). Same oracle and tolerance as above (the
    export of padded heads: nxd-models-llama/tests/test_padded_heads.py)."""
    pool = rank_pool(2)
    worst = {}
    for name, moe, export, heads in (("qwen3", False, "nxd_models_llama:collect_hf_state_dict", (3, 1)),
                                     ("qwen3_moe", True, "nxd_models_mixtral:collect_hf_state_dict", (3, 3))):
        src = save_hf(tmp_path / name, moe=moe, seed=7, num_attention_heads=heads[0], num_key_value_heads=heads[1])
        data = batch(seed=8)
        got = pool.run(parallel_grads_body, 2, 1, name, export, str(src), data, timeout=600)[0]
        worst[name] = check(got, hf_reference(src, data))
    print(f"\n3 query heads padded to 4 at TP=2 vs transformers: {worst}")
