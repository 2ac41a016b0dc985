"""``neuronx_distributed.modules.moe.experts``: NxD's ``Experts`` (the expert MLPs over all experts'
capacity slots, ``(E, C, H) -> (E, C, H)``) with NxD's constructor arguments, on NxD's expert-fused
parallel layers (``moe_parallel_layers``): fused gate/up (stride 2) or up, NxD's GLU / SwiGLU
activation and clamps, row-parallel down projection left unreduced over TP as NxD's."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.distributed import ProcessGroup

from neuronx_distributed.modules.moe.model_utils import GLUType
from neuronx_distributed.modules.moe.moe_parallel_layers import (
    ExpertFusedColumnParallelLinear,
    ExpertFusedRowParallelLinear,
)
from nxd_compat.surface import NotProvidedError
from nxd_core_parallel import parallel_state

__all__ = ["Experts"]


class Experts(torch.nn.Module):
    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, glu: bool,
                 activation_fn: Callable[[Tensor], Tensor], dtype: torch.dtype, device: torch.device,
                 bias: bool = False, glu_type: GLUType | str | None = GLUType.GLU,
                 hidden_act_scaling_factor: float = 1.0, hidden_act_bias: float = 0.0,
                 gate_clamp_upper_limit: float | None = None, gate_clamp_lower_limit: float | None = None,
                 up_clamp_upper_limit: float | None = None, up_clamp_lower_limit: float | None = None,
                 input_layer_init_method: Callable | None = None, output_layer_init_method: Callable | None = None,
                 is_prefill: bool = True, tensor_model_parallel_group: ProcessGroup | None = None,
                 expert_model_parallel_group: ProcessGroup | None = None,
                 expert_distribution: list[list[int]] | None = None) -> None:
        super().__init__()
        self._glu = glu
        self._glu_type = GLUType.validate(glu_type) if glu else glu_type
        self._activation_fn = activation_fn
        self.num_experts = num_experts
        self.hidden_act_scaling_factor, self.hidden_act_bias = hidden_act_scaling_factor, hidden_act_bias
        self.gate_clamp_upper_limit, self.gate_clamp_lower_limit = gate_clamp_upper_limit, gate_clamp_lower_limit
        self.up_clamp_upper_limit, self.up_clamp_lower_limit = up_clamp_upper_limit, up_clamp_lower_limit
        self.tensor_parallel_group = tensor_model_parallel_group or parallel_state.get_tensor_model_parallel_group()
        self.expert_model_parallel_group = (expert_model_parallel_group
                                            or parallel_state.get_expert_model_parallel_group())
        if self.expert_model_parallel_group.size() > 1:
            raise NotProvidedError(
                f"neuronx_distributed.modules.moe.experts.Experts at expert parallelism "
                f"{self.expert_model_parallel_group.size()} is not provided by nxd-compat (NxD's "
                "enter/exit_expert_parallel_region); use neuronx_distributed.modules.moe.ExpertMLPs inside MoE, "
                "whose experts nxd-moe dispatches all-to-all over the EP group")
        groups = {"tensor_model_parallel_group": self.tensor_parallel_group,
                  "expert_model_parallel_group": self.expert_model_parallel_group, "is_prefill": is_prefill,
                  "expert_distribution": expert_distribution, "bias": bias, "dtype": dtype, "device": device}
        if glu:  # gate and up fused into one matmul, split after it (stride 2: each rank holds both)
            self.gate_up_proj = ExpertFusedColumnParallelLinear(
                num_experts=num_experts, input_size=hidden_size, output_size=intermediate_size * 2, stride=2,
                init_method=input_layer_init_method, is_fused_gate_up=True, **groups)
        else:
            self.up_proj = ExpertFusedColumnParallelLinear(
                num_experts=num_experts, input_size=hidden_size, output_size=intermediate_size,
                init_method=input_layer_init_method, **groups)
        self.down_proj = ExpertFusedRowParallelLinear(
            num_experts=num_experts, input_size=intermediate_size, output_size=hidden_size, reduce_output=False,
            init_method=output_layer_init_method, **groups)

    def forward(self, hidden_states: Tensor, expert_indices: Tensor | None = None) -> Tensor:
        """``(E', C, H) -> (E', C, H)``, E' = E or ``len(expert_indices)``; the output is this TP
        rank's partial sum (NxD reduces it after combining the experts' outputs)."""
        assert len(hidden_states.shape) == 3
        computed = self.num_experts if expert_indices is None else expert_indices.shape[0]
        assert hidden_states.shape[0] in {1, computed}
        e, c, h = hidden_states.shape
        dispatched = hidden_states.view(e, 1, c, h)
        up = self.gate_up_proj if self._glu else self.up_proj
        intermediate = self._activation(up.forward(dispatched, expert_indices=expert_indices))
        return self.down_proj.forward(intermediate, expert_indices=expert_indices).squeeze(1)

    def _activation(self, x: Tensor) -> Tensor:
        if not self._glu:
            return self._activation_fn(x)
        gate, up = torch.chunk(x, chunks=2, dim=-1)
        if self.gate_clamp_lower_limit or self.gate_clamp_upper_limit:
            gate = gate.clamp(min=self.gate_clamp_lower_limit, max=self.gate_clamp_upper_limit)
        if self.up_clamp_lower_limit or self.up_clamp_upper_limit:
            up = up.clamp(min=self.up_clamp_lower_limit, max=self.up_clamp_upper_limit)
        if self._glu_type == GLUType.GLU:
            return self._activation_fn(self.hidden_act_scaling_factor * gate) * (up + self.hidden_act_bias)
        if self._glu_type == GLUType.SWIGLU:
            gate = gate * self._activation_fn(self.hidden_act_scaling_factor * gate)
            return gate * (up + self.hidden_act_bias)
        raise NotImplementedError(f"Only supports glu_type='glu', 'swiglu', got {self._glu_type}")
