"""GPT with query groups TP does not divide (NxD's ``kv_size_multiplier``): 12 heads in 3 groups at
TP=2 and TP=4, one group (MQA) at TP=2. K/V heads are replicated over TP, every local query head
attends to its Megatron group's KV head. Oracle: the one-process model built from the same seed
(fp32): loss and every gradient within 1e-5 relative; the replicas' gradients are summed so the
K/V weights stay identical. Checkpoints: saved at TP=2 (replicated), loaded at TP=1 and TP=4 with
the same logits and the one-device tensors (the checkpoint holds Megatron's interleaved rows); a
Megatron checkpoint loads into the replicated layout, and writing one at a TP that splits groups
is refused."""

from __future__ import annotations

import pytest
import torch

GQA3 = dict(vocab_size=128, make_vocab_size_divisible_by=32, hidden_size=48, num_layers=1, num_attention_heads=12,
            num_query_groups=3, ffn_hidden_size=64, max_position_embeddings=32, position_embedding_type="rope",
            normalization="RMSNorm", activation="swiglu", has_bias=True, hidden_dropout=0.0, attention_dropout=0.0)
MQA = dict(GQA3, num_attention_heads=4, num_query_groups=1, position_embedding_type="learned_absolute",
           normalization="LayerNorm", activation="gelu")
SEED = 3


def _data() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {"input_ids": torch.randint(0, 128, (2, 16), generator=g), "labels": torch.randint(0, 128, (2, 16), generator=g)}


def _parallel(tp: int) -> None:
    from nxd_core_parallel import parallel_state

    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)


def _build(config: dict, seed: int = SEED):
    from nxd.transforms import parallelize_model
    from nxd_models_gpt import GPTForCausalLM

    torch.manual_seed(seed)
    return parallelize_model(GPTForCausalLM(config))


def _full(local: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """The one-device tensor from every TP rank's ``local`` piece of ``param``."""
    import torch.distributed as dist

    from nxd_ckpt import merge_shards, sharding_of
    from nxd_core_parallel import parallel_state

    sharding = sharding_of(param)
    if sharding is None:
        return local.detach()
    group = parallel_state.get_tensor_model_parallel_group()
    pieces = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, local.detach().contiguous(), group=group)
    return merge_shards(pieces, sharding)


def _vocab_logits(local: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist

    from nxd_core_parallel import parallel_state

    group = parallel_state.get_tensor_model_parallel_group()
    pieces = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, local.detach().contiguous(), group=group)
    return torch.cat(pieces, dim=-1)


def _run(model, data: dict) -> dict:
    out = model(**data)
    out.loss.backward()
    logits = _vocab_logits(out.logits)
    grads = {n: _full(p.grad, p) for n, p in model.named_parameters()}
    return {"loss": out.loss.detach(), "logits": logits, "grads": grads}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def odd_kv_body(root: str) -> dict:
    import nxd
    from nxd_models_gpt.megatron_ckpt import load_megatron_checkpoint, save_megatron_checkpoint
    from nxd_tensor_parallel.parallel_plan import plan_mismatches

    data = _data()
    cases = (("gqa3_tp2", GQA3, 2, 2), ("mqa_tp2", MQA, 2, 2), ("gqa3_tp4", GQA3, 4, 4))
    _parallel(1)  # the one-process oracle
    want = {name: _run(_build(config), data) for name, config, _, _ in cases[:2]}
    reference = _build(GQA3).state_dict()
    megatron = f"{root}/megatron"
    if torch.distributed.get_rank() == 0:
        save_megatron_checkpoint(reference, GQA3, megatron, tp=1)
    torch.distributed.barrier()
    errors: dict = {}
    _parallel(2)
    for name, config, _tp, multiplier in cases[:2]:
        model = _build(config)
        assert model.decoder.layers[0].self_attention.linear_qkv.kv_size_multiplier == multiplier
        assert plan_mismatches(model, model.nxd_parallel_plan) == []
        got = _run(model, data)
        errors[name] = max([_rel(got["loss"], want[name]["loss"])] +
                           [_rel(got["grads"][n], g) for n, g in want[name]["grads"].items()])
    nxd.save_checkpoint(root, "tp2", model=_build(GQA3))  # saved with K/V replicated twice
    model = _build(GQA3, seed=SEED + 100)
    load_megatron_checkpoint(model, megatron)  # Megatron's interleaved rows -> this rank's replicated rows
    errors["differ_megatron_tp2"] = [n for n, p in model.named_parameters() if not torch.equal(_full(p, p), reference[n])]
    for tp in (4, 1):
        _parallel(tp)
        if tp == 4:
            model = _build(GQA3)
            assert model.decoder.layers[0].self_attention.linear_qkv.kv_size_multiplier == 4
            got = _run(model, data)
            errors["gqa3_tp4"] = max([_rel(got["loss"], want["gqa3_tp2"]["loss"])] +
                                     [_rel(got["grads"][n], g) for n, g in want["gqa3_tp2"]["grads"].items()])
        model = _build(GQA3, seed=SEED + 100)
        nxd.load_checkpoint(root, "tp2", model=model)
        errors[f"differ_tp{tp}"] = [n for n, p in model.named_parameters() if not torch.equal(_full(p, p), reference[n])]
        errors[f"reshard_tp{tp}_logits"] = _rel(_run(model, data)["logits"], want["gqa3_tp2"]["logits"])
    return errors


@pytest.mark.slow
def test_odd_query_groups_replicate_kv(rank_pool, tmp_path):
    results = rank_pool(4).run(odd_kv_body, str(tmp_path))
    print(f"\nGPT odd KV heads, max relative differences vs one process: {results[0]}")
    for r in results:
        assert r["differ_tp1"] == [] and r["differ_tp4"] == [] and r["differ_megatron_tp2"] == []
        assert max(v for v in r.values() if isinstance(v, float)) <= 1e-5, r


def test_megatron_export_at_a_tp_splitting_query_groups_is_refused(tmp_path):
    from nxd_models_gpt.megatron_ckpt import save_megatron_checkpoint

    with pytest.raises(ValueError, match="tp=2 must divide num_query_groups"):
        save_megatron_checkpoint({}, GQA3, tmp_path, tp=2)
