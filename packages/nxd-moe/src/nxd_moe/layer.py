"""The MoE layer: router -> (capacity) -> dispatch -> SwiGLU experts -> combine.

The layer is built plain (every expert, whole); the expert-parallel plan
(:mod:`nxd_moe.expert_plan`) splits its experts, and the layer follows their split:

Tensor parallelism (NxD's layout): the router is replicated, each TP rank holds every local
expert's slice of the intermediate dimension, and the partial outputs are summed over TP after
the affinity weighting (all-reduce; reduce-scatter under sequence parallelism). Expert
parallelism: experts are split over the EP group and tokens travel by all-to-all
(:mod:`nxd_moe.dispatch`).
"""

from __future__ import annotations

import torch
from torch import nn

from nxd.parallel import ParallelContext, dim_group, dim_size, resolve_context
from nxd_moe.capacity import expert_capacity, kept_assignments, max_routed_rows
from nxd_moe.config import MoEConfig
from nxd_moe.dispatch import combine, dispatch
from nxd_moe.experts import ExpertMLPs
from nxd_moe.losses import sequence_balance_loss
from nxd_moe.routing import make_router
from nxd_tensor_parallel.modules.plain import PlacedByPlan
from nxd_tensor_parallel.parallel_layers.mappings import (
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
)


class MoELayer(PlacedByPlan, nn.Module):
    """``forward(hidden [batch, seq(/tp under SP), hidden]) -> (output same shape, router_logits)``.

    ``router_logits`` ``[batch*seq, num_experts]`` (batch-major rows, all of this rank's tokens
    even under sequence parallelism) feed :func:`nxd_moe.load_balancing_loss`.

    Capacity dropping (``capacity_factor`` without ``dropless``) counts tokens in NxD's order,
    sequence position first (NxD's activations are ``[seq, batch, hidden]``), over this rank's
    micro-batch.
    """

    def __init__(self, config: MoEConfig, hidden_size: int, intermediate_size: int, sequence_parallel: bool = False,
                 sequence_dimension: int = 1, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None, init_std: float = 0.02,
                 output_init_std: float | None = None, context: ParallelContext | None = None,
                 shared_intermediate_size: int = 0) -> None:
        super().__init__()
        if sequence_dimension != 1:
            raise ValueError("MoELayer takes batch-first activations [batch, seq, hidden] (sequence_dimension=1)")
        self.config = MoEConfig.from_dict(config)
        self.sequence_parallel = sequence_parallel
        #: the parallel context the layer is built for (``None``: the current one; a family's plan
        #: sets it, :class:`~nxd_tensor_parallel.modules.plain.PlacedByPlan`); its TP group sums the
        #: experts' partial outputs once the plan has split them over TP
        self.parallel_context = resolve_context(context)
        self.router = make_router(self.config.routing_algorithm, self.config.num_experts, self.config.top_k,
                                  hidden_size, self.config.sinkhorn_iterations, self.config.sinkhorn_tol,
                                  dtype=dtype, device=device, init_std=init_std,
                                  activation=self.config.router_activation, n_group=self.config.n_group,
                                  topk_group=self.config.topk_group, expert_bias=self.config.expert_bias)
        self.router.bias_update_rate = self.config.bias_update_rate
        self.nxd_parallelized(self.parallel_context)
        self.experts = ExpertMLPs(self.config.num_experts, hidden_size, intermediate_size, dtype=dtype, device=device,
                                  init_std=init_std, output_init_std=output_init_std,
                                  grouped_gemm=self.config.grouped_gemm)
        #: shared experts (DeepSeek-V3): one dense SwiGLU every token goes through, unweighted, TP-sharded
        #: like the routed experts and never split over EP (``shared_intermediate_size`` = the shared
        #: experts' intermediate sizes together); its partial output joins the routed one before the
        #: single TP reduction
        self.shared_experts = ExpertMLPs(1, hidden_size, shared_intermediate_size, dtype=dtype, device=device,
                                         init_std=init_std, output_init_std=output_init_std,
                                         expert_parallel=False) if shared_intermediate_size else None
        #: DeepSeek-V3's sequence-wise balance loss of the last training forward (``seq_aux_loss_coef`` > 0)
        self.last_seq_aux_loss: torch.Tensor | None = None

    def nxd_parallelized(self, context: ParallelContext | None) -> None:
        """Under SP each TP rank routes only its sequence slice: the router's gradient is partial and
        the optimizer sums it over TP (like norm weights). Called again once a plan has placed the layer."""
        self.router.weight.sequence_parallel_enabled = self.sequence_parallel and dim_size(context, "tp") > 1

    @property
    def ep_size(self) -> int:
        """The expert-parallel size the experts are split over (1 before the plan splits them)."""
        return self.experts.ep_size

    def _tp_group(self) -> object:
        """The group the experts' partial outputs are summed over: TP once the plan split them;
        ``None``: experts whole, nothing to sum (the caller skips the collectives: to NxD's mapping
        functions ``None`` would mean the current TP group)."""
        return dim_group(self.parallel_context, "tp") if self.experts.tp_size > 1 else None

    def nxd_plan_note(self) -> str:
        """What ``nxd plan`` assumed for this layer's routed tokens (it collects one note per kind)."""
        factor = self.config.effective_capacity_factor
        limit = f"capacity_factor {factor:g}" if factor is not None else "dropless"
        if self.ep_size == 1 and factor is None:
            return "MoE activations planned for exactly tokens x top_k routed rows per rank (EP=1, dropless)"
        return (f"MoE activations planned for the most routed rows an EP rank can receive (EP={self.ep_size}, "
                f"{limit}: nxd_moe.max_routed_rows); a balanced load needs less")

    def _routed_at_most(self, tokens: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """The routed experts' output on the meta device (``nxd plan`` measures activations there:
        no values, so no routing decisions): this rank's experts receive :func:`max_routed_rows`
        rows, split evenly over them, the same ops as the real path on those shapes (gather, expert
        MLPs, weighting, scatter back), so the activations planned hold the most routed tokens.
        The all-to-alls of EP are not issued."""
        cfg, t = self.config, tokens.shape[0]
        rows = max_routed_rows(t, cfg.num_experts, cfg.top_k, self.ep_size, cfg.effective_capacity_factor)
        local = cfg.num_experts // self.ep_size
        counts = [rows // local + (e < rows % local) for e in range(local)]
        index = torch.empty(rows, dtype=torch.long, device=tokens.device)
        out = self.experts(tokens.index_select(0, index), counts)
        sent = weights.numel()  # this rank's assignments come back to its tokens
        back = out.index_select(0, torch.empty(sent, dtype=torch.long, device=tokens.device))
        token_ids = torch.empty(sent, dtype=torch.long, device=tokens.device)
        return torch.zeros_like(tokens).index_add(0, token_ids, (back * weights.reshape(-1, 1).to(back.dtype)).to(tokens.dtype))

    def route(self, probs: torch.Tensor, index: torch.Tensor, batch: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(weights [T, k], kept [T, k])`` from the softmax ``probs`` and chosen ``index``."""
        cfg = self.config
        weights = probs.gather(1, index)
        factor = cfg.effective_capacity_factor
        if factor is None:
            kept = torch.ones_like(index, dtype=torch.bool)
        else:
            capacity = expert_capacity(index.shape[0], cfg.num_experts, cfg.top_k, factor)
            seq_major = torch.arange(index.shape[0], device=index.device).view(batch, seq).T.reshape(-1)
            kept = torch.empty_like(index, dtype=torch.bool)
            kept[seq_major] = kept_assignments(index[seq_major], cfg.num_experts, capacity)
            weights = weights * kept
        if cfg.normalize_top_k_affinities:
            weights = weights / weights.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(weights.dtype).tiny)
        if cfg.routed_scaling_factor != 1.0:
            weights = weights * cfg.routed_scaling_factor
        return weights, kept

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tp = dim_size(self.parallel_context, "tp")
        sp = self.sequence_parallel and tp > 1
        if sp and self.experts.tp_size != tp:
            raise RuntimeError(f"MoELayer under sequence parallelism at TP={tp} holds experts split for TP="
                               f"{self.experts.tp_size}: apply the expert-parallel plan first "
                               "(nxd.transforms.parallelize_model / nxd.build_parallel_model)")
        tp_group = self._tp_group()
        logits, probs = self.router.logits_and_probs(hidden)
        if sp:
            # every TP rank routes the whole micro-batch: the gradient of the gathered affinities is
            # partial per rank (experts are TP-sharded) and is reduce-scattered back; the logits that
            # feed the replicated auxiliary loss take the local slice of theirs
            full = gather_from_sequence_parallel_region(hidden, 1, to_model_parallel=True, process_group=tp_group)
            probs = gather_from_sequence_parallel_region(probs, 1, to_model_parallel=True, process_group=tp_group)
            logits = gather_from_sequence_parallel_region(logits, 1, to_model_parallel=False, process_group=tp_group)
        elif tp_group is not None:
            full = copy_to_tensor_model_parallel_region(hidden, process_group=tp_group)
            # the weighted sum below is partial over TP until the final reduction: sum the
            # affinities' gradient over TP so the router sees the whole of it
            probs = copy_to_tensor_model_parallel_region(probs, process_group=tp_group)
        else:
            full = hidden
        b, s, h = full.shape
        tokens = full.reshape(b * s, h)
        probs = probs.reshape(b * s, -1)
        logits = logits.reshape(b * s, -1)
        with torch.no_grad():
            index = self.router.choose(probs.detach(), logits.detach())
        weights, kept = self.route(probs, index, b, s)
        if self.config.seq_aux_loss_coef and self.training:
            self.last_seq_aux_loss = sequence_balance_loss(probs, index, b, self.config.num_experts)
        if tokens.is_meta:
            out = self._routed_at_most(tokens, weights)
        else:
            token_ids = torch.arange(b * s, device=tokens.device).unsqueeze(1).expand_as(index)[kept]
            expert_ids, weights = index[kept], weights[kept]
            shard = self.experts.shard  # tokens travel to the EP ranks holding their experts
            grouped, plan = dispatch(tokens, token_ids, expert_ids, self.config.num_experts, shard.ep_size,
                                     shard.ep_group)
            out = combine(self.experts(grouped, plan.local_counts), plan)  # rows in plan.order
            weights = weights[plan.order].unsqueeze(1).to(out.dtype)
            # under autocast the experts' matmuls give bf16 rows while the residual stream stays fp32:
            # the sum is taken in the stream's dtype (as transformers' MoE blocks do)
            out = torch.zeros_like(tokens).index_add(0, token_ids[plan.order], (out * weights).to(tokens.dtype))
        if self.shared_experts is not None:
            out = out + self.shared_experts(tokens, [b * s])
        out = out.view(b, s, h)
        if sp:
            out = reduce_scatter_to_sequence_parallel_region(out, 1, process_group=tp_group)
        elif tp_group is not None:
            out = reduce_from_tensor_model_parallel_region(out, process_group=tp_group)
        return out, logits
