"""``neuronx_distributed.modules.moe.shared_experts``: NxD's ``SharedExperts``, the dense SwiGLU
experts every token goes through (``MoE(shared_experts=...)``), with NxD's modules and parameter
names: ``gate_proj`` / ``up_proj`` (``ColumnParallelLinear``, ``[n*I/tp, H]``) or, with
``fused_gate_up_projection``, ``gate_up_proj`` (``ColumnParallelLinear(stride=2)``, this rank's gate
rows then its up rows); ``down_proj`` (``RowParallelLinear(reduce_output=False)``, ``[H, n*I/tp]``).

As NxD's, ``forward`` returns this TP rank's partial output (the down projection does not reduce);
``MoE`` adds it to the routed experts' partial output before its one TP reduction. Refused:
``sequence_parallel_enabled=True`` (NxD's inference path: weights replicated on every rank, sliced
per rank for token generation) and ``transpose_weights=True`` (NxD's transposed inference layout)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from neuronx_distributed.modules.moe.model_utils import ACT2FN
from neuronx_distributed.parallel_layers.layers import ColumnParallelLinear, RowParallelLinear
from nxd_compat.surface import NotProvidedError, not_provided

__all__ = ["SharedExperts"]


class SharedExperts(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, num_shared_experts: int, hidden_act: str,
                 dtype: torch.dtype = torch.float32, tensor_model_parallel_group: Any = None,
                 reduce_dtype: torch.dtype = torch.float32, fused_gate_up_projection: bool = False,
                 sequence_parallel_enabled: bool = False, transpose_weights: bool = False) -> None:
        super().__init__()
        for name, value in (("sequence_parallel_enabled", sequence_parallel_enabled),
                            ("transpose_weights", transpose_weights)):
            if value:
                raise NotProvidedError(f"neuronx_distributed.modules.moe.SharedExperts({name}=True) is not provided by "
                                       "nxd-compat: it is NxD's inference layout (replicated / transposed weights for "
                                       "Neuron kernels); training shards the shared experts over TP")
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.num_shared_experts, self.act_fn, self.dtype = num_shared_experts, ACT2FN[hidden_act], dtype
        self.reduce_dtype, self.fused_gate_up_projection = reduce_dtype, fused_gate_up_projection
        self.sequence_parallel_enabled, self.transpose_weights = False, False
        self.tensor_parallel_group = tensor_model_parallel_group
        expert_dim = intermediate_size * num_shared_experts
        common = dict(bias=False, dtype=dtype, reduce_dtype=reduce_dtype,
                      tensor_model_parallel_group=tensor_model_parallel_group)
        column = dict(common, gather_output=False)
        if fused_gate_up_projection:
            self.gate_up_proj = ColumnParallelLinear(hidden_size, 2 * expert_dim, stride=2, **column)
        else:
            self.gate_proj = ColumnParallelLinear(hidden_size, expert_dim, **column)
            self.up_proj = ColumnParallelLinear(hidden_size, expert_dim, **column)
        self.down_proj = RowParallelLinear(expert_dim, hidden_size, input_is_parallel=True, reduce_output=False,
                                           **common)

    def forward(self, x: torch.Tensor, seq_len: int) -> torch.Tensor:
        """NxD's: this rank's partial output ``[..., H]`` (the column layers copy ``x`` to the TP
        region, so the input gradient is summed over TP)."""
        if self.fused_gate_up_projection:
            gate, up = torch.chunk(self.gate_up_proj(x), chunks=2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(self.act_fn(gate) * up)

    def local_output(self, tokens: torch.Tensor) -> torch.Tensor:
        """The partial output from this rank's weights alone, no collective: for ``MoE``, whose
        tokens are already in the TP region (their gradient summed over TP once, by the layer)."""
        if self.fused_gate_up_projection:
            gate, up = torch.chunk(F.linear(tokens, self.gate_up_proj.weight), chunks=2, dim=-1)
        else:
            gate, up = F.linear(tokens, self.gate_proj.weight), F.linear(tokens, self.up_proj.weight)
        return F.linear(self.act_fn(gate) * up, self.down_proj.weight)


_INFERENCE = ("NxD's transposed-weight linear layers for inference kernels; SharedExperts(transpose_weights=True) is "
              "refused too")
__getattr__ = not_provided(__name__, {n: _INFERENCE for n in ("ColumnParallelLinearTransposed",
                                                              "RowParallelLinearTransposed")})
