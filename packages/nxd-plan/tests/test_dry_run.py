"""``--dry-run``: every rank built by the real parallel code on torch's fake process group agrees
with the plan, and a rank whose layout disagrees is reported by number."""

from __future__ import annotations

from nxd_plan.dryrun import dry_run
from nxd_plan.planner import make_run_plan


def test_every_rank_agrees_with_the_plan(tiny) -> None:
    plan = make_run_plan(tiny())
    result = dry_run(plan, tiny())
    assert result.ok, result.problems
    assert result.ranks_built == 8 and result.parameters_total == plan.parameters_total


def test_fsdp_ranks_agree_with_fsdps_chunking(tiny) -> None:
    """Every rank's fully_shard DTensors (the real FSDP2 on meta parameters) against the plan's
    Shard(0) rule at the rank's DP coordinate; a plan with the wrong rule is caught."""
    config = tiny(distributed_strategy={"pipeline_model_parallel_size": 1, "zero1": False, "fsdp": True},
                  model={"vocab_size": 510})
    plan = make_run_plan(config)
    result = dry_run(plan, config)
    assert result.ok, result.problems
    plan.ranks[7].params += 64  # as if the last DP rank held an even shard
    assert sorted(dry_run(plan, config, ranks=[6, 7]).problems) == [7]


def test_an_inconsistent_rank_is_reported(tiny) -> None:
    plan = make_run_plan(tiny())
    # the plan now expects a different shape on the second stage: its four ranks must disagree
    reference = plan.shards[(1, 0)]
    name = next(n for n in reference.params if n.endswith("down_proj.weight"))
    shape, dtype, trainable = reference.params[name]
    reference.params[name] = ((shape[0], shape[1] + 1), dtype, trainable)
    plan.ranks[6].params += 1
    result = dry_run(plan, tiny())
    assert sorted(result.problems) == [4, 5, 6, 7]
    assert name in result.problems[4][0]
    assert any("parameters stored != planned" in p for p in result.problems[6])


def test_nxdt_70b_ranks_at_both_ends(nxdt_conf) -> None:
    """NxD Training's 70B config at its 512 ranks: the first and last rank of each end of the
    pipeline, and one in the middle (the whole world: ``nxd plan ... --dry-run``, docs/plan.md)."""
    overrides = ["model.model_config=null", "+model.preset=llama3-70b", "model.encoder_seq_length=512",
                 "data.seq_length=512"]
    source = nxdt_conf / "hf_llama3_70B_config.yaml"
    plan = make_run_plan(source, overrides)
    result = dry_run(plan, source, overrides, ranks=[0, 31, 255, 480, 511])
    assert not result.problems, result.problems


def test_nxdt_lora_config_ranks(nxdt_conf) -> None:
    """NxD Training's LoRA SFT config: the adapters' init seed is shared from rank 0 by a collective
    the fake group carries no data for (rank 1 read an unset object size and failed before)."""
    overrides = ["model.model_config=null", "+model.preset=llama3-8b", "model.encoder_seq_length=512",
                 "data.seq_length=512"]
    source = nxdt_conf / "hf_llama3_8B_SFT_lora_config.yaml"
    plan = make_run_plan(source, overrides)
    result = dry_run(plan, source, overrides, ranks=[0, 1, 31])
    assert not result.problems, result.problems
