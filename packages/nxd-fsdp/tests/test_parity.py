"""FSDP2 against one process (fp32, AdamW, clipping on and acting): losses, clipping norms and the
parameters after the last step, on real gloo ranks.

Tolerance: the parallel run differs from the single-process fp32 run only in the order of its
sums (reduce-scatter, sharded norms), so its error is of the size of fp32 rounding in this
computation, which the same reference run in fp64 measures (``rounding``). The tests assert the
issue's 1e-5 relative, and print the measured numbers."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from fsdp_models import LR, MAX_NORM, batch, build, full_params, held_bytes, params_rel, unsharded_bytes

import nxd
import nxd_fsdp
from nxd_testing.reference import max_rel, train_reference

STEPS = 6
TOL = 1e-5


def reference(dtype: torch.dtype = torch.float32) -> tuple[list[float], list[float], dict[str, torch.Tensor]]:
    model = build(dtype=dtype)
    data = [tuple(t for t in batch(s)) for s in range(STEPS)]
    run = train_reference(model, torch.optim.AdamW(model.parameters(), lr=LR), data, max_norm=MAX_NORM)
    return run.losses, run.grad_norms, {k: v.detach().float() for k, v in model.state_dict().items()}


_REF: dict = {}


def oracle() -> tuple[list[float], list[float], dict[str, torch.Tensor]]:
    if not _REF:
        losses, norms, params = reference()
        losses64, _, params64 = reference(torch.float64)
        _REF["run"] = (losses, norms, params)
        _REF["rounding"] = max(max_rel(losses, losses64), params_rel(params, params64))
        assert losses[-1] < losses[0] - 0.1 and max(norms) > MAX_NORM  # it learns, and clipping acts
    return _REF["run"]


def fsdp_body(tp: int = 1, sp: bool = False, fsdp: object = True, micro_batches: int = 1,
              activation_checkpoint: bool = False, compile: bool = False) -> tuple[list[float], list[float], dict | None]:
    from fsdp_models import Block

    # the user's path: the strategy is a registered model transform, chosen by fsdp_config
    cfg = nxd.neuronx_distributed_config(tensor_parallel_size=tp, sequence_parallel=sp, fsdp_config=fsdp,
                                         optimizer_config={"grad_clipping": True, "max_grad_norm": MAX_NORM},
                                         activation_checkpoint_config=[Block] if activation_checkpoint else None,
                                         compile_config=compile)
    ctx = nxd.get_parallel_context()
    model = nxd.initialize_parallel_model(cfg, build, False, sp)
    compiled = [m._compiled_call_impl is not None for m in model.modules() if isinstance(m, Block)]
    assert compiled == [compile] * len(compiled), compiled  # the compile transform ran before FSDP's
    opt = nxd.initialize_parallel_optimizer(cfg, torch.optim.AdamW, model.parameters(), lr=LR)
    assert isinstance(model, nxd_fsdp.FSDPModel) and isinstance(opt, nxd_fsdp.FSDPOptimizer)
    losses, norms = [], []
    for step in range(STEPS):
        ids, labels = batch(step)
        per = ids.shape[0] // ctx.dp.size
        ids, labels = ids[ctx.dp.rank * per:(ctx.dp.rank + 1) * per], labels[ctx.dp.rank * per:(ctx.dp.rank + 1) * per]
        if micro_batches == 1:
            loss = model.run_train(ids, labels)
        else:
            loss = model.run_train(*({"ids": i, "labels": lab} for i, lab in
                                     zip(ids.chunk(micro_batches), labels.chunk(micro_batches))))
        opt.step()
        held = held_bytes(model, opt)
        opt.zero_grad()
        loss = loss.detach().clone()
        dist.all_reduce(loss, group=ctx.dp.group)
        losses.append(float(loss) / ctx.dp.size)
        norms.append(float(opt.grad_norm))
    params = full_params(model, ctx.tp.group)
    if micro_batches > 1:  # between micro-batches the parameters stay gathered (plain tensors, not shards)
        from torch.distributed.tensor import DTensor

        with model.no_sync():
            model.module(ids[:1], labels[:1]).backward()
            assert not any(isinstance(p, DTensor) for p in model.module.parameters())
        model.module(ids[:1], labels[:1]).backward()  # the last micro-batch: reduce-scatter, then reshard
        assert all(isinstance(p, DTensor) for p in model.module.parameters())
    return losses, norms, params if ctx.rank == 0 else None, held


def check(results: list, label: str, shards: int | None = None) -> float:
    """Parity with the oracle; with ``shards``, every rank holds exactly 1/shards of the parameters,
    gradients and optimizer state (the tiny model's dim-0 sizes divide 4: no padding)."""
    ref_losses, ref_norms, ref_params = oracle()
    worst = 0.0
    if shards is not None:
        whole = unsharded_bytes()
        for *_, held in results:
            assert held == {k: v // shards for k, v in whole.items()}, (label, held, whole)
        print(f"{label}: per rank {results[0][3]} of unsharded {whole} (1/{shards})")
    for losses, norms, params, _ in results:
        worst = max(worst, max_rel(losses, ref_losses), max_rel(norms, ref_norms))
        if params is not None:
            worst = max(worst, params_rel(params, ref_params))
    print(f"{label}: max rel diff (losses, clip norms, params after {STEPS} steps) {worst:.2e}; "
          f"fp32 rounding of the reference (vs fp64) {_REF['rounding']:.2e}")
    assert worst < TOL, (label, worst)
    return worst


def test_fsdp_dp2_matches_one_process(rank_pool):
    check(rank_pool(2).run(fsdp_body), "FSDP DP=2", shards=2)


def test_fsdp_dp2_zero2_accumulation_and_checkpointing(rank_pool):
    # ZeRO-2 (keep gathered params after forward), 2 micro-batches, activation checkpointing
    check(rank_pool(2).run(fsdp_body, fsdp={"reshard_after_forward": False}, micro_batches=2,
                           activation_checkpoint=True), "FSDP DP=2 reshard_after_forward=False, 2 micro-batches, AC")


@pytest.mark.slow
def test_fsdp_dp2_compiled_blocks_match_one_process(rank_pool):
    # torch.compile per block (inductor on CPU) then fully_shard each compiled block, against eager one process
    check(rank_pool(2).run(fsdp_body, compile=True, timeout=900), "FSDP DP=2, compile_config=True (inductor)",
          shards=2)


@pytest.mark.four_ranks
@pytest.mark.slow
def test_hsdp_2x2_matches_one_process(rank_pool):
    check(rank_pool(4).run(fsdp_body, fsdp={"replicate_degree": 2}), "HSDP 2x2", shards=2)


@pytest.mark.four_ranks
@pytest.mark.slow
def test_tp2_fsdp2_sp_matches_one_process(rank_pool):
    check(rank_pool(4).run(fsdp_body, tp=2, sp=True), "TP=2 x FSDP=2 + SP")
