"""Pipeline parity for any registered model family: the same weights at PP=1 in one process (gradient
accumulation over every micro-batch) against PP=2 (x EP, x DP) on real ranks through nxd-pipeline's
1F1B schedule and NxDOptimizer's gradient sync. nxd-pipeline is imported inside the rank body only,
so a package needs it in its test extra, not nxd-testing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def accumulated_reference(model: torch.nn.Module, micro: Sequence[Mapping[str, torch.Tensor]]
                          ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """What PP=1 training does with gradient accumulation: backward of ``loss / len(micro)`` per
    micro-batch (``model(**mb)``); returns the mean loss and the named gradients."""
    losses = []
    for mb in micro:
        loss = model(**mb).loss
        (loss / len(micro)).backward()
        losses.append(loss.detach())
    return torch.stack(losses).mean(), {n: p.grad for n, p in model.named_parameters()}


def pipeline_grads_body(spec_name: str, hf_dir: str, micro: Sequence[Mapping[str, torch.Tensor]], pp: int = 2,
                        ep: int = 1, checkpointing: bool = False) -> dict[str, Any]:
    """Every rank: the reference (PP=1, EP=1, the family's model imported from ``hf_dir``) accumulates
    ``loss / len(micro)`` over all ``micro`` batches; then the same weights at PP=``pp`` x EP=``ep``
    (DP = world / pp, each DP rank running its contiguous share of ``micro``), gradients synced by
    NxDOptimizer (DP mean; the routed experts' over the expert-data-parallel ranks). Returns the
    relative error of the DP-mean loss and of each local parameter's gradient (its EP slice of the
    reference's), the reference's parameter names and this rank's stage."""
    import nxd
    from nxd_core_parallel import parallel_state
    from nxd_core_parallel.activation_checkpoint import apply_activation_checkpointing
    from nxd_core_parallel.trainer import NxDOptimizer
    from nxd_pipeline import NxDPPModel
    from nxd_testing.reference import build_from_hf

    parallel_state.initialize_model_parallel(1, 1)
    spec, reference = build_from_hf(spec_name, hf_dir)
    ref_loss, ref_grads = accumulated_reference(reference, micro)
    state = reference.state_dict()
    parallel_state.destroy_model_parallel()

    context = parallel_state.initialize_model_parallel(1, pp, expert_model_parallel_size=ep)
    dp, d = context.dp.size, context.dp.rank
    per = len(micro) // dp
    model = nxd.build_parallel_model(spec, reference.config, context=context)
    if checkpointing:
        assert apply_activation_checkpointing(model, spec.transformer_layer_classes) > 0
    model = NxDPPModel(model, pp, {"num_microbatches": per, "schedule": "1f1b"}, context=context)
    model.load_state_dict(_local_state(model, state, context.ep.rank))
    loss = model.run_train(*micro[d * per:(d + 1) * per])
    dist.all_reduce(loss, group=context.dp.group)
    params = list(model.local_module().parameters())
    NxDOptimizer(torch.optim.SGD(params, lr=0.0), {"optimizer_config": {"grad_clipping": False}},
                 overlap_grad_sync=False, context=context).sync_gradients()
    ep_rank = context.ep.rank
    grads = {}
    for name, p in model.local_module().named_parameters():
        want = ref_grads[name]
        if getattr(p, "expert_model_parallel", False):  # this EP rank's routed experts
            want = want[ep_rank * p.shape[0]:(ep_rank + 1) * p.shape[0]]
        assert p.grad is not None and p.grad.shape == want.shape, f"{name}: no or wrongly shaped gradient"
        grads[name] = _rel(p.grad, want)
    return {"loss": _rel(loss / dp, ref_loss), "grads": grads, "all": sorted(ref_grads),
            "stage": context.pp.rank}


def _local_state(model: torch.nn.Module, state: Mapping[str, torch.Tensor], ep_rank: int) -> dict[str, torch.Tensor]:
    """The PP=1 state dict cut to this stage's keys, routed experts to EP rank ``ep_rank``'s slice."""
    out = {}
    for name, local in model.state_dict().items():
        full = state[name]
        out[name] = full[ep_rank * local.shape[0]:(ep_rank + 1) * local.shape[0]] if full.shape != local.shape else full
    return out


def assert_pipeline_parity(per_rank: Sequence[Mapping[str, Any]], tol: float = 1e-5) -> tuple[float, float]:
    """Every reference parameter checked on some stage, both stages present, loss and every gradient
    within ``tol`` relative; returns the worst loss and gradient errors."""
    checked = {name for r in per_rank for name in r["grads"]}
    assert sorted(checked) == per_rank[0]["all"], set(per_rank[0]["all"]) ^ checked
    assert len({r["stage"] for r in per_rank}) > 1
    worst_loss = max(r["loss"] for r in per_rank)
    worst_name, worst_grad = max(((n, v) for r in per_rank for n, v in r["grads"].items()), key=lambda t: t[1])
    assert worst_loss <= tol, f"loss: relative error {worst_loss:.3g} > {tol}"
    assert worst_grad <= tol, f"{worst_name}: relative error {worst_grad:.3g} > {tol}"
    return worst_loss, worst_grad
