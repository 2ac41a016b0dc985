"""A Llama (nxd-models-llama, a test-only dependency) saved at TP=1 loads at TP=2.

Its ``mlp.gate_up_proj`` is a fused parameter (local rows ``[gate_r; up_r]``, ``fused_splits``),
the case where applying a Megatron stride inside each fused piece interleaves rows. Oracles: the
TP=1 model's logits (gathered TP=2 logits equal within fp32 reduction-order noise), and a TP=2
model built from the saving seed (core-parallel layers initialise the full tensor and keep their
shard, so its state is the exact expected result of the reshard).
"""

from __future__ import annotations

from pathlib import Path

import torch

import nxd
from nxd.transforms import parallelize_model
from nxd_ckpt import Sharding, merge_shards, split_full

CONFIG = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, initializer_range=0.1)
SAVE_SEED, OTHER_SEED = 0, 1


def _model(tp: int, seed: int, **overrides):
    from nxd_core_parallel import parallel_state
    from nxd_models_llama import LlamaConfig, LlamaForCausalLM

    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tp)
    torch.manual_seed(seed)
    return parallelize_model(LlamaForCausalLM(LlamaConfig.from_dict({**CONFIG, **overrides})))


def tp1_to_tp2_body(path: str) -> dict:
    from nxd_models_llama import gather_vocab_logits

    ids = torch.randint(0, CONFIG["vocab_size"], (2, 8), generator=torch.Generator().manual_seed(5))
    model = _model(1, SAVE_SEED)
    with torch.no_grad():
        tp1_logits = model(ids).logits
    nxd.save_checkpoint(path, "tp1", model=model)

    model = _model(2, OTHER_SEED)
    nxd.load_checkpoint(path, "tp1", model=model)
    with torch.no_grad():
        tp2_logits = gather_vocab_logits(model(ids).logits)
    loaded = model.state_dict()
    expected = _model(2, SAVE_SEED).state_dict()
    differ = sorted(k for k in expected if not torch.equal(loaded[k], expected[k]))
    rel = float((tp2_logits - tp1_logits).abs().max() / tp1_logits.abs().max())
    return {"rel": rel, "differ": differ}


def test_llama_saved_at_tp1_loads_at_tp2_with_equal_logits(rank_pool, tmp_path):
    results = rank_pool(2).run(tp1_to_tp2_body, str(tmp_path))
    print(f"\nLlama TP=1 checkpoint at TP=2: logits max relative difference {max(r['rel'] for r in results):.2e}")
    for r in results:
        assert r["differ"] == []  # every tensor, gate_up_proj included, is the TP=2 shard of the saved one
        assert r["rel"] <= 1e-5


def odd_vocab_body(path: str) -> dict:
    """Vocabulary 101 at TP=2 (padded to 102 inside) saved, then loaded at TP=1 and back at TP=2."""
    import json

    from nxd_models_llama import gather_vocab_logits

    ids = torch.randint(0, 101, (2, 8), generator=torch.Generator().manual_seed(5))
    model = _model(2, SAVE_SEED, vocab_size=101)
    with torch.no_grad():
        tp2_logits = gather_vocab_logits(model(ids).logits, 101)
    nxd.save_checkpoint(path, "tp2", model=model)
    tensors = json.loads((Path(path) / "tp2" / "metadata.json").read_text())["tensors"]
    shapes = [tensors[k]["shape"] for k in ("model.embed_tokens.weight", "lm_head.weight")]

    model = _model(1, OTHER_SEED, vocab_size=101)
    nxd.load_checkpoint(path, "tp2", model=model)
    with torch.no_grad():
        tp1_logits = model(ids).logits
    expected = _model(1, SAVE_SEED, vocab_size=101).state_dict()
    differ = sorted(k for k, v in model.state_dict().items() if not torch.equal(v, expected[k]))
    nxd.save_checkpoint(path, "tp1", model=model)
    model = _model(2, OTHER_SEED, vocab_size=101)
    nxd.load_checkpoint(path, "tp1", model=model)
    expected = _model(2, SAVE_SEED, vocab_size=101).state_dict()
    differ += sorted(k for k, v in model.state_dict().items() if not torch.equal(v, expected[k]))
    rel = float((tp2_logits - tp1_logits).abs().max() / tp1_logits.abs().max())
    return {"shapes": shapes, "logits": list(tp1_logits.shape), "rel": rel, "differ": differ}


def test_odd_vocabulary_padded_at_tp2_reshards_at_its_real_size(rank_pool, tmp_path):
    results = rank_pool(2).run(odd_vocab_body, str(tmp_path))
    print(f"\nvocab 101 TP=2 -> TP=1 -> TP=2: logits max relative difference {max(r['rel'] for r in results):.2e}")
    for r in results:
        assert r["shapes"] == [[101, 32], [101, 32]]  # the checkpoint holds the real vocabulary
        assert r["logits"] == [2, 8, 101]
        assert r["differ"] == []  # every tensor equals the model built at the target TP from the saving seed
        assert r["rel"] <= 1e-5


def test_fused_splits_pieces_are_contiguous_even_with_a_recorded_stride():
    gate, up = torch.arange(8.0).view(4, 2), torch.arange(8.0, 16.0).view(4, 2)
    shards = [torch.cat([gate[:2], up[:2]]), torch.cat([gate[2:], up[2:]])]  # TP=2: [gate_r; up_r]
    # the metadata older checkpoints wrote for gate_up_proj: stride 2 beside fused_splits
    legacy = Sharding.from_json({"dim": 0, "stride": 2, "fused_splits": [2, 2], "kv_size_multiplier": 1})
    assert legacy == Sharding(dim=0, fused_splits=(2, 2))
    assert torch.equal(merge_shards(shards, legacy), torch.cat([gate, up]))
    assert all(torch.equal(split_full(torch.cat([gate, up]), legacy, 2, r), shards[r]) for r in (0, 1))
