"""The family's parallel plan (data on its ModelSpec) names exactly the parallel layers it makes of
the plain build; the build itself is plain, and the plan applied by the transform list is the same
model on every path (``nxd.build_parallel_model``, ``initialize_parallel_model``, a meta-device build)."""

from __future__ import annotations

import nxd
from nxd_tensor_parallel.parallel_plan import plan_mismatches

CONFIG = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2)


def test_parallel_plan_matches_the_built_model():
    spec = nxd.get_model("llama")
    model = nxd.build_parallel_model(spec, CONFIG)
    assert spec.parallel_plan is not None
    assert plan_mismatches(model, spec.parallel_plan) == []


def test_the_family_is_built_plain_and_its_plan_makes_it_parallel():
    """``spec.build``: one-device modules only (the plan's data is all that parallelises it)."""
    from nxd_tensor_parallel.modules import plain
    from nxd_tensor_parallel.parallel_plan import LAYER_STYLES

    spec = nxd.get_model("llama")
    model = spec.build(spec.config_from_dict(CONFIG))
    named = [name for name, _ in model.named_modules() if model.nxd_parallel_plan.style_of(name) in
             ("column", "row", "vocab")]
    assert len(named) == 2 * 4 + 2
    assert all(type(model.get_submodule(n)) in (plain.Linear, plain.Embedding, plain.QKVLinear) for n in named)
    parallel = {cls for cls, style in LAYER_STYLES.items() if style != "sequence"}
    assert not [n for n, m in model.named_modules() if type(m) in parallel]
    assert plan_mismatches(nxd.transforms.parallelize_model(model), model.nxd_parallel_plan) == []


def every_path_builds_the_same_model_body(config: dict, sequence_parallel: bool) -> list[str]:
    """On each rank, from the same seed: ``nxd.build_parallel_model`` and ``initialize_parallel_model``
    on the meta device (the plan applied to meta parameters, then each module's ``reset_parameters``):
    every parameter, its sharding attributes and the loss bitwise equal."""
    import torch

    from nxd_core_parallel.model_init import reset_parameters

    spec = nxd.get_model("llama")
    nxd_config = nxd.neuronx_distributed_config(tensor_parallel_size=2, sequence_parallel=sequence_parallel)
    torch.manual_seed(0)
    direct = nxd.build_parallel_model(spec, dict(config), nxd_config)
    meta_config = nxd.neuronx_distributed_config(
        tensor_parallel_size=2, sequence_parallel=sequence_parallel,
        model_init_config={"meta_device_init": True, "param_init_fn": reset_parameters})
    torch.manual_seed(0)
    planned = nxd.initialize_parallel_model(meta_config, nxd.parallel.bind_context(spec.build, direct.parallel_context),
                                            False, spec.config_from_dict(dict(config)), meta_config).local_module()
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


def test_every_path_applies_the_plan_to_the_same_model(rank_pool):
    # 101-word vocabulary (padded at TP=2), 3 KV heads for 6 query heads (replicated KV at TP=2)
    config = dict(CONFIG, vocab_size=101, hidden_size=48, num_attention_heads=6, num_key_value_heads=3)
    for sequence_parallel in (False, True):
        for rank, problems in enumerate(rank_pool(2).run(every_path_builds_the_same_model_body, config,
                                                         sequence_parallel)):
            assert problems == [], (rank, sequence_parallel, problems)
