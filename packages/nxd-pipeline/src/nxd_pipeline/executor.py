"""Runs one rank's schedule actions: stage compute plus the sends/receives each action implies."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from nxd_core_parallel.loss_terms import add_loss_terms
from nxd_pipeline import partition as part
from nxd_pipeline import split_backward as sb
from nxd_pipeline.comm import P2P, PipelineGroup, batch_signature
from nxd_pipeline.schedules import BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, FORWARD, Action


class StageRunner:
    """Computes one stage of the pruned model through the model's pipeline methods."""

    def __init__(self, model: nn.Module, layout: dict[str, Any], bounds: list[range],
                 loss_spec: tuple[bool, ...] | None, loss_fn: Callable[..., Any] | None) -> None:
        self.model = model
        self.layout = layout
        self.bounds = bounds
        self.loss_spec = loss_spec
        self.loss_fn = loss_fn
        self.last = len(bounds) - 1
        self.api = part.pipeline_interface(model)
        self._layer_fn = getattr(self.api, "nxd_pipeline_layer", None)
        #: stages seen recomputing activations (checkpointing) in a split backward: their
        #: backward runs combined from then on (see split_backward.watch_recompute)
        self.recomputing: set[int] = set()
        #: activation shapes exchanged so far, by (stage, batch signature); kept across steps
        self.activation_shapes: dict = {}

    def stage_parameters(self, stage: int) -> list[nn.Parameter]:
        layers = part.get_submodule(self.model, self.layout["layers"])
        modules = [layers[i] for i in self.bounds[stage]]
        if stage == 0:
            modules += [part.get_submodule(self.model, p) for p in self.layout["embed"]]
        if stage == self.last:
            modules += [part.get_submodule(self.model, p) for p in self.layout["head"]]
        seen: dict[int, nn.Parameter] = {}
        for module in modules:
            for p in module.parameters():
                seen.setdefault(id(p), p)
        return list(seen.values())

    def forward(self, stage: int, hidden: torch.Tensor | None, batch: dict[str, Any],
                loss_terms: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """The stage's output: the activation to send on, or on the last stage the loss (the head
        output's named loss terms added into ``loss_terms`` when given)."""
        model = self.model
        if stage == 0:
            hidden = self.api.nxd_pipeline_embed(**batch)
        layers = part.get_submodule(model, self.layout["layers"])
        for index in self.bounds[stage]:
            layer = layers[index]
            hidden = self._layer_fn(layer, hidden, **batch) if self._layer_fn else layer(hidden)
        if stage != self.last:
            return hidden
        out = self.api.nxd_pipeline_head(hidden, **batch)
        if self.loss_fn is not None:
            out = self.loss_fn(out, **batch)
        if loss_terms is not None:
            add_loss_terms(loss_terms, out)
        return self._loss(out)

    def _loss(self, out: Any) -> torch.Tensor:
        if self.loss_spec is not None:
            out = out[self.loss_spec.index(True)]
        elif not isinstance(out, torch.Tensor):
            out = out["loss"] if isinstance(out, dict) else out.loss
        if not isinstance(out, torch.Tensor) or out.dim() != 0:
            raise TypeError(f"the last pipeline stage must produce a scalar loss tensor, got {type(out).__name__}")
        return out


def _receives(a: Action, stage: int, num_stages: int) -> bool:
    if a.kind == FORWARD:
        return stage > 0
    return a.kind in (BACKWARD, BACKWARD_INPUT) and stage < num_stages - 1


@dataclass
class _InFlight:
    stage_input: torch.Tensor | None
    output: torch.Tensor
    record: sb.Recorded | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def run_schedule(runner: StageRunner, pg: PipelineGroup, actions: list[Action], micro: list[dict[str, Any]],
                 num_stages: int, train: bool = True, trace: list | None = None,
                 loss_terms: dict[str, torch.Tensor] | None = None) -> list[torch.Tensor]:
    """Execute ``actions`` on this rank; returns the last stage's per-micro-batch losses (empty
    elsewhere). Backward scales each loss by ``1 / len(micro)`` (mean over micro-batches).
    ``trace``, when given, receives ``(action, compute_seconds)`` per action (receives excluded);
    ``loss_terms`` the last stage's named loss terms summed over the micro-batches."""
    p, r, m = pg.size, pg.rank, len(micro)
    comm = P2P(pg, runner.activation_shapes)
    signatures = [batch_signature(mb) for mb in micro]
    flights: dict[tuple[int, int], _InFlight] = {}
    losses: dict[int, torch.Tensor] = {}
    scale = 1.0 / m
    split = any(a.kind in (BACKWARD_INPUT, BACKWARD_WEIGHT) for a in actions)
    params_by_stage: dict[int, list[nn.Parameter]] = {}
    receives = [i for i, a in enumerate(actions) if _receives(a, a.chunk * p + r, num_stages)]
    next_receive = 0  # index into ``receives`` of the next receive not yet pre-posted

    def prepost(after: int) -> None:
        """Post the first receive after action ``after`` whose buffer can be made now."""
        nonlocal next_receive
        while next_receive < len(receives) and receives[next_receive] <= after:
            next_receive += 1
        if next_receive == len(receives):
            return
        b = actions[receives[next_receive]]
        b_stage = b.chunk * p + r
        if b.kind == FORWARD:
            comm.prepost_activation((b_stage - 1) % p, b_stage, b.microbatch, signatures[b.microbatch])
        elif (b_stage, b.microbatch) in flights:
            comm.prepost_gradient(flights[(b_stage, b.microbatch)].output, (b_stage + 1) % p, b_stage + 1, b.microbatch)

    try:
        for index, a in enumerate(actions):
            stage = a.chunk * p + r
            key = (stage, a.microbatch)
            if a.kind == FORWARD:
                x = None
                if stage > 0:
                    x = comm.recv_activation((stage - 1) % p, stage, a.microbatch, signatures[a.microbatch])
                    if train and x.is_floating_point():
                        x.requires_grad_()
                prepost(index)
                t0 = time.perf_counter()
                if train and split and stage not in runner.recomputing:
                    if stage not in params_by_stage:
                        params_by_stage[stage] = runner.stage_parameters(stage)
                    with sb.record_param_outputs(params_by_stage[stage]) as rec:
                        out = runner.forward(stage, x, micro[a.microbatch], loss_terms)
                else:
                    rec = None
                    out = runner.forward(stage, x, micro[a.microbatch], loss_terms)
                compute = time.perf_counter() - t0
                if stage == num_stages - 1:
                    losses[a.microbatch] = out.detach()
                else:
                    comm.send_activation(out, (stage + 1) % p, stage + 1, a.microbatch, signatures[a.microbatch])
                if train:
                    flights[key] = _InFlight(x, out, rec)
            elif a.kind in (BACKWARD, BACKWARD_INPUT):
                flight = flights[key]
                out, grad = flight.output, None
                if stage == num_stages - 1:
                    out = out * scale
                else:
                    grad = comm.recv_gradient(out, (stage + 1) % p, stage + 1, a.microbatch)
                prepost(index)
                t0 = time.perf_counter()
                if a.kind == BACKWARD or flight.record is None:
                    if a.kind == BACKWARD:
                        del flights[key]
                    if out.requires_grad:
                        torch.autograd.backward(out, grad)
                    input_grad = flight.stage_input.grad if flight.stage_input is not None else None
                else:
                    with sb.watch_recompute() as watch:
                        input_grad = sb.backward_input(flight.record, out, grad, flight.stage_input)
                    if watch.seen:
                        runner.recomputing.add(stage)
                compute = time.perf_counter() - t0
                if stage > 0:
                    if input_grad is None:
                        input_grad = torch.zeros_like(flight.stage_input)
                    comm.send_gradient(input_grad, (stage - 1) % p, stage, a.microbatch)
            elif a.kind == BACKWARD_WEIGHT:
                prepost(index)
                t0 = time.perf_counter()
                record = flights.pop(key).record
                if record is not None:  # None: the input pass already did the whole backward
                    sb.backward_weight(record)
                compute = time.perf_counter() - t0
            else:
                raise ValueError(f"unknown pipeline action kind {a.kind!r} in {a}")
            if trace is not None:
                trace.append((a, compute))
    finally:
        comm.finish()
    return [losses[i] for i in sorted(losses)]
