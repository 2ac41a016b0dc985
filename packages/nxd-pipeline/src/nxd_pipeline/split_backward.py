"""Backward split into an input-gradient pass and a weight-gradient pass (zero-bubble schedules).

During the forward of a stage, a global module forward hook records the outputs of every module
that owns parameters directly. The input pass asks autograd for the gradients of the stage input
and of those outputs only, so no weight gradient is computed (autograd skips edges nobody asked
for). The weight pass later turns each recorded output gradient into its module's parameter
gradients, a short local backward through that module alone. Parameters used outside any module
forward (e.g. a tied weight read functionally) or by several module calls are handled in the
input pass, so nothing is lost or counted twice. Not supported: a parameter used both inside a
module's forward and functionally upstream of it within one stage.

Activation checkpointing recomputes a region once per autograd call, so the weight pass would
recompute a checkpointed layer once per module in it. :func:`watch_recompute` notices module
forwards running inside the input pass; the executor then runs that stage's later backwards
combined (one recompute, weight grads in the input pass, empty weight pass).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class Recorded:
    """What the forward of one (stage, micro-batch) left for the split backward."""

    outputs: list[tuple[list[nn.Parameter], list[torch.Tensor]]] = field(default_factory=list)
    output_grads: list[list[torch.Tensor | None]] = field(default_factory=list)
    uncovered: list[nn.Parameter] = field(default_factory=list)


def _tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value] if value.requires_grad else []
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


@contextmanager
def record_param_outputs(stage_params: Sequence[nn.Parameter]) -> Iterator[Recorded]:
    """Record, during a stage forward, the outputs of modules that own parameters of the stage."""
    wanted = {id(p) for p in stage_params if p.requires_grad}
    rec = Recorded()
    covered: set[int] = set()

    def hook(module: nn.Module, _args: object, output: object) -> None:
        params = [p for p in module.parameters(recurse=False) if id(p) in wanted]
        outs = _tensors(output)
        if params and outs and torch.is_grad_enabled():
            rec.outputs.append((params, outs))
            covered.update(id(p) for p in params)

    handle = nn.modules.module.register_module_forward_hook(hook)
    try:
        yield rec
    finally:
        handle.remove()
    # A parameter recorded by several module calls (tied weights, a module used twice) is reachable
    # from one call's output through another call's input: a per-module weight pass would count
    # it twice. Such parameters get their gradient in the input pass instead.
    uses: dict[int, int] = {}
    for params, _ in rec.outputs:
        for p in params:
            uses[id(p)] = uses.get(id(p), 0) + 1
    shared = {pid for pid, n in uses.items() if n > 1}
    rec.outputs = [([p for p in params if id(p) not in shared], outs) for params, outs in rec.outputs]
    rec.outputs = [(params, outs) for params, outs in rec.outputs if params]
    covered -= shared
    rec.uncovered = [p for p in stage_params if p.requires_grad and id(p) not in covered]


@dataclass
class RecomputeWatch:
    seen: bool = False


@contextmanager
def watch_recompute() -> Iterator[RecomputeWatch]:
    """Flags module forwards run while inside the block: during a backward that means recomputation."""
    watch = RecomputeWatch()

    def hook(_module: nn.Module, _args: object, _output: object) -> None:
        watch.seen = True

    handle = nn.modules.module.register_module_forward_hook(hook)
    try:
        yield watch
    finally:
        handle.remove()


def backward_input(rec: Recorded, output: torch.Tensor, grad: torch.Tensor | None,
                   stage_input: torch.Tensor | None) -> torch.Tensor | None:
    """Input pass: returns d(loss)/d(stage_input); keeps output grads for :func:`backward_weight`."""
    flat = [t for _, outs in rec.outputs for t in outs]
    inputs: list[torch.Tensor] = ([stage_input] if stage_input is not None else []) + flat + list(rec.uncovered)
    if not inputs:
        return None
    grads = torch.autograd.grad([output], inputs, grad_outputs=[grad] if grad is not None else None,
                                retain_graph=True, allow_unused=True)
    offset = 1 if stage_input is not None else 0
    input_grad = grads[0] if stage_input is not None else None
    out_grads = list(grads[offset:offset + len(flat)])
    for p, g in zip(rec.uncovered, grads[offset + len(flat):]):
        _accumulate(p, g)
    pos = 0
    for _, outs in rec.outputs:
        rec.output_grads.append(out_grads[pos:pos + len(outs)])
        pos += len(outs)
    return input_grad


def backward_weight(rec: Recorded) -> None:
    """Weight pass: parameter gradients from the recorded output gradients; frees the graph."""
    for (params, outs), grads in zip(rec.outputs, rec.output_grads):
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None]
        if not pairs:
            continue
        param_grads = torch.autograd.grad([o for o, _ in pairs], params, grad_outputs=[g for _, g in pairs],
                                          retain_graph=True, allow_unused=True)
        for p, g in zip(params, param_grads):
            _accumulate(p, g)
    rec.outputs.clear()
    rec.output_grads.clear()


def _accumulate(p: nn.Parameter, g: torch.Tensor | None) -> None:
    if g is None:
        return
    p.grad = g.detach().clone() if p.grad is None else p.grad.add_(g)
