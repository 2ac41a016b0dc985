"""The family's parallel plan (data on its ModelSpec) names exactly the parallel layers it builds."""

from __future__ import annotations

import nxd
from nxd_core_parallel.parallel_plan import plan_mismatches

CONFIG = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2)


def test_parallel_plan_matches_the_built_model():
    spec = nxd.get_model("llama")
    model = spec.build(spec.config_from_dict(CONFIG))
    assert spec.parallel_plan is not None
    assert plan_mismatches(model, spec.parallel_plan) == []


def test_the_family_is_built_plain_and_its_plan_makes_it_parallel():
    """``parallelize=False``: one-device modules only (the plan's data is all that parallelises it)."""
    from nxd_core_parallel.modules import plain
    from nxd_models_llama import LlamaForCausalLM

    model = LlamaForCausalLM(dict(CONFIG), parallelize=False)
    named = [name for name, _ in model.named_modules() if model.nxd_parallel_plan.style_of(name) in
             ("column", "row", "vocab")]
    assert len(named) == 2 * 4 + 2
    assert all(type(model.get_submodule(n)) in (plain.Linear, plain.Embedding, plain.QKVLinear) for n in named)
    assert plan_mismatches(LlamaForCausalLM(dict(CONFIG)), model.nxd_parallel_plan) == []


def transform_equals_direct_build_body(config: dict, sequence_parallel: bool) -> list[str]:
    """On each rank: the model the constructor parallelises and the plain model the ``parallel_plan``
    transform of ``initialize_parallel_model`` parallelises, from the same seed: every parameter,
    its sharding attributes and the loss bitwise equal."""
    import torch

    from nxd_models_llama import LlamaForCausalLM

    nxd_config = nxd.neuronx_distributed_config(tensor_parallel_size=2, sequence_parallel=sequence_parallel)
    context = nxd.get_parallel_context()
    torch.manual_seed(0)
    direct = LlamaForCausalLM(dict(config), sequence_parallel, context=context)
    torch.manual_seed(0)
    plain_model = LlamaForCausalLM(dict(config), sequence_parallel, context=context, parallelize=False)
    planned = nxd.initialize_parallel_model(nxd_config, lambda: plain_model, False).local_module()
    attrs = ("tensor_model_parallel", "partition_dim", "partition_stride", "fused_splits", "kv_size_multiplier",
             "sequence_parallel_enabled")
    problems = []
    ref = dict(direct.named_parameters())
    for name, param in planned.named_parameters():
        if not torch.equal(param, ref[name]):
            problems.append(f"{name}: values differ")
        if {a: getattr(param, a, None) for a in attrs} != {a: getattr(ref[name], a, None) for a in attrs}:
            problems.append(f"{name}: sharding attributes differ")
    ids = torch.randint(0, config["vocab_size"], (2, 8), generator=torch.Generator().manual_seed(1))
    if not torch.equal(planned(ids, labels=ids).loss, direct(ids, labels=ids).loss):
        problems.append("loss differs")
    return problems


def test_plain_family_parallelised_by_the_transform_equals_the_direct_build(rank_pool):
    # 101-word vocabulary (padded at TP=2), 3 KV heads for 6 query heads (replicated KV at TP=2)
    config = dict(CONFIG, vocab_size=101, hidden_size=48, num_attention_heads=6, num_key_value_heads=3)
    for sequence_parallel in (False, True):
        for rank, problems in enumerate(rank_pool(2).run(transform_equals_direct_build_body, config,
                                                         sequence_parallel)):
            assert problems == [], (rank, sequence_parallel, problems)
