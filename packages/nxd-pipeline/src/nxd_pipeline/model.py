"""``NxDPPModel``: one model cut into pipeline stages, trained by a registered schedule."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from nxd.errors import ConfigError
from nxd.parallel import ParallelContext, resolve_context
from nxd_core_parallel.trainer import autocast_context
from nxd_core_parallel.wrapper import ForwardsToModule
from nxd_pipeline import partition as part
from nxd_pipeline.comm import PipelineGroup
from nxd_pipeline.config import PipelineConfig, parse_pipeline_config
from nxd_pipeline.executor import StageRunner, run_schedule
from nxd_pipeline.groups import data_parallel_group, pipeline_group, subgroup
from nxd_pipeline.schedules import FORWARD, Action, PipelineSchedule


def _lookup_schedule(name: str) -> PipelineSchedule:
    import nxd

    schedule = nxd.get_component("pipeline_schedule", name, need=f"pipeline_config.schedule={name!r}")
    if not isinstance(schedule, PipelineSchedule):
        raise ConfigError(f"pipeline schedule {name!r} is a {type(schedule).__name__}, not an nxd_pipeline.PipelineSchedule")
    return schedule


class NxDPPModel(ForwardsToModule, nn.Module):
    """The local stages of a pipeline-able model (see docs/pipeline.md), with NxD's interface:
    ``run_train(**batch)`` runs forward and backward over ``num_microbatches`` micro-batches and
    returns the mean loss on every pipeline rank; ``run_eval(**batch)`` the loss without grads.

    Parameter names are the original model's (global layer indices), so ``state_dict()`` of each
    rank merges into the unsplit model's.
    """

    def __init__(self, module: nn.Module, pipeline_parallel_size: int, pipeline_config: dict | PipelineConfig | None = None,
                 *, schedule: PipelineSchedule | None = None, group: PipelineGroup | None = None,
                 context: ParallelContext | None = None) -> None:
        super().__init__()
        #: the parallel context the stages are cut for (``context=None``: the current one, as NxD's
        #: constructor has no room for it)
        self.parallel_context = resolve_context(context)
        cfg = pipeline_config if isinstance(pipeline_config, PipelineConfig) else parse_pipeline_config(
            pipeline_config, pipeline_parallel_size)
        self.pipeline_config = cfg
        self.schedule = schedule or _lookup_schedule(cfg.schedule)
        self.pg = group or pipeline_group(pipeline_parallel_size, self.parallel_context)
        p, v = self.pg.size, cfg.virtual_pipeline_size
        if v > 1 and not self.schedule.virtual:
            raise ConfigError(
                f"pipeline_config.virtual_pipeline_size={v} needs a schedule with virtual stages (interleaved_1f1b), "
                f"got {self.schedule.name!r}"
            )
        self.num_stages = p * v
        self.layout = part.model_layout(module)
        self._check_layer_classes(module, cfg.transformer_layer_cls or tuple(getattr(module, "nxd_transformer_layer_classes", ())))
        self.stage_bounds = part.plan_stages(module, self.num_stages, cfg.pipeline_cuts, cfg.partition_method)
        self.local_stages = [c * p + self.pg.rank for c in range(v)]
        tied = part.tied_parameters(module)
        part.prune_to_stages(module, self.stage_bounds, self.local_stages)
        self.module = module
        self._shared = self._setup_shared_weights(tied)
        #: set to a list to receive ``(action, compute_seconds)`` of the next steps (benchmarks)
        self.trace: list | None = None
        #: the names of the last stage's loss terms, once broadcast (see _broadcast_with_terms)
        self._term_names: list[str] | None = None
        self._runner = StageRunner(module, self.layout, self.stage_bounds, cfg.output_loss_value_spec, cfg.loss_fn)

    # ------------------------------------------------------------------ structure
    def _check_layer_classes(self, module: nn.Module, classes: tuple[type, ...]) -> None:
        if not classes:
            return
        layers = part.get_submodule(module, self.layout["layers"])
        wrong = [type(layer).__name__ for layer in layers if not isinstance(layer, classes)]
        # activation checkpointing may wrap layers; accept a wrapper exposing the original module
        wrong = [w for w, layer in zip(wrong, layers) if not isinstance(getattr(layer, "_checkpoint_wrapped_module", None), classes)]
        if wrong:
            names = ", ".join(c.__name__ for c in classes)
            raise ConfigError(f"{self.layout['layers']!r} holds {sorted(set(wrong))}, not the transformer layer classes ({names})")

    def _stage_of_param(self, name: str) -> list[int]:
        """Stages that keep parameter ``name``: embedding -> first, head -> last, layer i -> its stage."""
        if part.module_of(name, self.layout["embed"]):
            return [0]
        if part.module_of(name, self.layout["head"]):
            return [self.num_stages - 1]
        prefix = self.layout["layers"] + "."
        if name.startswith(prefix):
            index = int(name[len(prefix):].split(".", 1)[0])
            return [s for s, bounds in enumerate(self.stage_bounds) if index in bounds]
        return list(range(self.num_stages))  # declared nowhere: every stage keeps it

    def _setup_shared_weights(self, tied: list[list[str]]) -> list[tuple[nn.Parameter, dist.ProcessGroup]]:
        """Tied weights kept by several pipeline ranks: make them equal now (first owner's value)
        and return (param, group) pairs whose grads are summed after every step."""
        local = dict(self.module.named_parameters(remove_duplicate=False))
        shared = []
        for names in tied:
            pp_ranks = sorted({s % self.pg.size for n in names for s in self._stage_of_param(n)})
            if len(pp_ranks) < 2:
                continue
            group = subgroup(self.pg, tuple(pp_ranks), self.parallel_context)
            mine = [local[n] for n in names if n in local]
            if group is None or not mine:
                continue
            param = mine[0]
            with torch.no_grad():
                dist.broadcast(param.data, src=self.pg.ranks[pp_ranks[0]], group=group)
            if self.pg.rank != pp_ranks[0]:
                param.pipeline_shared_duplicate = True  # grad-norm code may skip the duplicate copy
            shared.append((param, group))
        return shared

    # ------------------------------------------------------------------ NxD interface
    def local_module(self) -> nn.Module:
        """The pruned model this rank runs (global parameter names)."""
        return self.module

    def local_stage_layers(self) -> dict[int, list[int]]:
        """Stage -> global layer indices, for this rank's stages."""
        return {s: list(self.stage_bounds[s]) for s in self.local_stages}

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple[str, nn.Parameter]]:
        return self.module.named_parameters(prefix=prefix, recurse=recurse, remove_duplicate=remove_duplicate)

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True, assign: bool = False) -> Any:
        """Load this rank's part of a full (or merged) state dict; keys of other stages are ignored."""
        own = self.module.state_dict()
        missing = [k for k in own if k not in state_dict]
        if strict and missing:
            raise KeyError(f"state dict lacks {len(missing)} key(s) of pipeline stage(s) {self.local_stages}: {missing[:5]}")
        return self.module.load_state_dict({k: v for k, v in state_dict.items() if k in own}, strict=strict, assign=assign)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a pipelined model runs through run_train(**batch) / run_eval(**batch), not forward()")

    def _split(self, batch: dict[str, Any]) -> list[dict[str, Any]]:
        m = self.pipeline_config.num_microbatches
        sizes = {k: v.shape[0] for k, v in batch.items() if isinstance(v, torch.Tensor) and v.dim() > 0}
        for key, size in sizes.items():
            if size % m:
                raise ValueError(f"batch[{key!r}] has {size} rows, not divisible by num_microbatches={m}")
        out: list[dict[str, Any]] = [{} for _ in range(m)]
        for key, value in batch.items():
            parts = value.chunk(m, dim=0) if key in sizes else [value] * m
            for i in range(m):
                out[i][key] = parts[i]
        return out

    def run_train(self, *micro_batches: dict[str, Any], autocast: torch.dtype | None = None,
                  loss_terms: dict[str, torch.Tensor] | None = None, **batch: Any) -> torch.Tensor:
        """Forward and backward of one global batch (NxD's ``run_train(**batch)``, split into
        ``num_microbatches``) or of the given micro-batches (nxd's step contract); returns the mean
        micro-batch loss on every pipeline rank (and averaged over data parallel with
        ``broadcast_and_average_loss``). ``autocast``: run the schedule under ``torch.autocast``.
        ``loss_terms``, when given, receives the last stage's named loss terms (the head output's
        ``loss_terms``, see nxd_core_parallel.loss_terms) summed over the micro-batches, on every
        pipeline rank."""
        micro = list(micro_batches) if micro_batches else self._split(batch)
        with autocast_context(micro[0], autocast):
            return self._train(micro, loss_terms)

    def _train(self, micro: list[dict[str, Any]], loss_terms: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        actions = self.schedule.actions(self.pg.size, self.pg.rank, len(micro), self.pipeline_config.virtual_pipeline_size)
        terms: dict[str, torch.Tensor] | None = None if loss_terms is None else {}
        losses = run_schedule(self._runner, self.pg, actions, micro, self.num_stages, trace=self.trace,
                              loss_terms=terms)
        for param, group in self._shared:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            dist.all_reduce(param.grad, group=group)
        return self._reduce_loss(losses, len(micro), terms, loss_terms)

    @torch.no_grad()
    def run_eval(self, *micro_batches: dict[str, Any], autocast: torch.dtype | None = None,
                 loss_terms: dict[str, torch.Tensor] | None = None, **batch: Any) -> torch.Tensor:
        """Forward only (one global batch or the given micro-batches); returns the mean
        micro-batch loss on every pipeline rank (``loss_terms`` as for ``run_train``)."""
        micro = list(micro_batches) if micro_batches else self._split(batch)
        with autocast_context(micro[0], autocast):
            return self._eval(micro, loss_terms)

    def _eval(self, micro: list[dict[str, Any]], loss_terms: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        v = self.pipeline_config.virtual_pipeline_size
        actions = [Action(FORWARD, c, i) for i in range(len(micro)) for c in range(v)]
        actions.sort(key=lambda a: (a.microbatch // self.pg.size, a.chunk, a.microbatch))
        terms: dict[str, torch.Tensor] | None = None if loss_terms is None else {}
        losses = run_schedule(self._runner, self.pg, actions, micro, self.num_stages, train=False, loss_terms=terms)
        return self._reduce_loss(losses, len(micro), terms, loss_terms)

    def _reduce_loss(self, losses: list[torch.Tensor], m: int, terms: dict[str, torch.Tensor] | None = None,
                     out_terms: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """The last stage's mean loss on every pipeline rank; with ``out_terms`` also its summed
        loss ``terms``, added into ``out_terms`` (one broadcast carries both)."""
        last = self.pg.ranks[(self.num_stages - 1) % self.pg.size]
        param = next(self.parameters(), None)  # the broadcast below needs the backend's device (NCCL: CUDA)
        device = param.device if param is not None else torch.device("cpu")
        loss = torch.stack(losses).mean() if losses else torch.zeros((), device=device)
        loss = loss.detach().float().reshape(1).to(device)
        if out_terms is None:
            names, values = [], loss.clone()
            dist.broadcast(values, src=last, group=self.pg.group)
        else:
            names, values = self._broadcast_with_terms(loss, terms or {}, last, device)
        if self.pipeline_config.broadcast_and_average_loss:
            dp = data_parallel_group(self.parallel_context)
            if dp is not None:
                dist.all_reduce(values, group=dp)
                values /= dist.get_world_size(dp)
        for name, value in zip(names, values[1:]):
            out_terms[name] = out_terms[name] + value if name in out_terms else value.clone()  # type: ignore[index]
        return values[0].clone()

    def _broadcast_with_terms(self, loss: torch.Tensor, terms: dict[str, torch.Tensor], last: int,
                              device: torch.device) -> tuple[list[str], torch.Tensor]:
        """``(names, [loss, *terms by name])`` from the last stage. Only that stage knows the names:
        they travel on the first call and again only when they change (a flag in the values says
        so), so a step costs one broadcast."""
        if self._term_names is None:
            self._term_names = self._broadcast_names(sorted(terms), last)
        while True:
            names = self._term_names
            changed = dist.get_rank() == last and sorted(terms) != names
            zero = torch.zeros((), device=device)
            values = torch.stack([loss[0], zero + float(changed)] + [terms.get(n, zero).to(device) for n in names])
            dist.broadcast(values, src=last, group=self.pg.group)
            if not values[1]:
                return names, torch.cat([values[:1], values[2:]])
            self._term_names = self._broadcast_names(sorted(terms), last)

    def _broadcast_names(self, names: list[str], last: int) -> list[str]:
        holder: list[Any] = [names]
        dist.broadcast_object_list(holder, src=last, group=self.pg.group)
        return holder[0]
