"""Check a model family's declared :class:`nxd.specs.ParallelPlan` against the model it builds:
the plan is data other tools read (``nxd plan``, a parallel-plan transform), so it must name every
parallel layer the model holds, in the right style, and no module that is not there."""

from __future__ import annotations

from torch import nn

from nxd.specs import PLAN_STYLES, ParallelPlan
from nxd_tensor_parallel.modules.grouped_qkv import GroupedQKVColumnParallelLinear
from nxd_tensor_parallel.modules.qkv_linear import GQAQKVColumnParallelLinear
from nxd_tensor_parallel.modules.rms_norm import RMSNorm
from nxd_tensor_parallel.parallel_layers.layer_norm import LayerNorm
from nxd_tensor_parallel.parallel_layers.layers import ColumnParallelLinear, ParallelEmbedding, RowParallelLinear

#: layer class -> the plan style its modules must be named under
LAYER_STYLES: dict[type, str] = {
    ColumnParallelLinear: "column", GQAQKVColumnParallelLinear: "column", GroupedQKVColumnParallelLinear: "column",
    RowParallelLinear: "row",
    ParallelEmbedding: "vocab", RMSNorm: "sequence", LayerNorm: "sequence",
}


def plan_mismatches(model: nn.Module, plan: ParallelPlan, layer_styles: dict[type, str] | None = None) -> list[str]:
    """Every disagreement between ``plan`` and ``model`` (empty: they agree). ``layer_styles`` adds
    classes of other packages (e.g. nxd-moe's ``ExpertMLPs`` -> ``"experts"``)."""
    styles = {**LAYER_STYLES, **(layer_styles or {})}
    problems = [f"{style} pattern {pattern!r} names no module" for style in (*PLAN_STYLES, "pipeline_blocks",
                                                                              "context_parallel", "padded",
                                                                              "whole_sequence")
                for pattern in getattr(plan, style) if not ParallelPlan(**{style: (pattern,)}).modules(model, style)]
    for name, module in model.named_modules():
        want = next((style for cls, style in styles.items() if type(module) is cls), None)
        if want == "column" and getattr(module, "gather_output", False):
            want = "gathered"
        if want == "row" and not getattr(module, "input_is_parallel", True):
            want = "scattered"
        have = plan.style_of(name)
        if want is not None and have != want:
            problems.append(f"{name} ({type(module).__name__}) is {want} parallel; the plan says {have}")
        elif want is None and have is not None and have != "partial_grad":  # any replicated module may be
            problems.append(f"{name} ({type(module).__name__}) is named {have} parallel by the plan but is not")
    return problems
