"""Odd KV-head counts at TP=2 (3 KV heads, 6 query heads), NxD's ``kv_size_multiplier`` way: the
KV heads are replicated (here on both ranks) and each local query head attends to the KV head HF's
grouping gives it (query head i -> KV head i // 2). Oracle: transformers' LlamaForCausalLM
(logits, loss and every gradient); the HF export is byte-equal to its source; a checkpoint saved
at TP=2 loads at TP=1 (resharding the replicated K/V) with the same logits."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from nxd.transforms import parallelize_model

sys.path.insert(0, str(Path(__file__).parent))
from llama_test_utils import (  # noqa: E402
    CONFIGS,
    assert_same_tensors,
    batch,
    compare,
    hf_reference,
    parity_body,
    quiet_transformers,
    roundtrip_body,
    save_hf,
)

quiet_transformers()
CONFIGS["kv3"] = dict(CONFIGS["mha"], hidden_size=48, num_attention_heads=6, num_key_value_heads=3)


def test_kv_multiplier_choice():
    from nxd_models_llama import LlamaConfig
    from nxd_models_llama.modeling import kv_size_multiplier_for

    def m(nq, nkv, tp):
        return kv_size_multiplier_for(LlamaConfig.from_dict(dict(CONFIGS["mha"], num_attention_heads=nq, head_dim=8,
                                                                 num_key_value_heads=nkv)), tp)

    assert [m(8, 8, 2), m(8, 2, 4), m(8, 1, 8), m(6, 3, 2), m(12, 3, 4), m(12, 6, 4)] == [1, 2, 8, 2, 4, 2]


def reshard_body(hf_dir: str, root: str) -> torch.Tensor:
    import nxd
    from nxd_core_parallel import parallel_state
    from nxd_models_llama import LlamaForCausalLM, gather_vocab_logits, load_hf_checkpoint

    config = json.loads((Path(hf_dir) / "config.json").read_text())
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    model = parallelize_model(LlamaForCausalLM(config))
    load_hf_checkpoint(model, hf_dir)
    nxd.save_checkpoint(root, "tp2", model=model)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    torch.manual_seed(5)
    single = parallelize_model(LlamaForCausalLM(config))
    nxd.load_checkpoint(root, "tp2", model=single)
    with torch.no_grad():
        return gather_vocab_logits(single(batch()["input_ids"]).logits, single.config.vocab_size)


@pytest.mark.slow
def test_three_kv_heads_at_tp2(rank_pool, tmp_path):
    src = save_hf("kv3", tmp_path / "kv3")
    data = batch()
    pool = rank_pool(2)
    result = pool.run(parity_body, 2, [("kv3", str(src), False)], {"kv3": data})[0][("kv3", False)]
    print(f"\nkv3 at TP=2 worst relative error: {compare(result, hf_reference(src, data))}")
    pool.run(roundtrip_body, 2, str(src), str(tmp_path / "out"), data["input_ids"][:1, :4], 2)
    assert_same_tensors(tmp_path / "out", src)
    logits = pool.run(reshard_body, str(src), str(tmp_path / "ckpt"))[0]
    from transformers import LlamaForCausalLM

    want = LlamaForCausalLM.from_pretrained(str(src))(data["input_ids"]).logits
    assert ((logits - want).abs().max() / want.abs().max()).item() < 1e-5
