"""``neuronx_distributed.modules.moe.moe_parallel_layers``: NxD's expert-fused parallel linear layers
with NxD's constructor arguments and layouts (weight ``[E_local, H, I/tp]`` column-parallel,
``[E_local, I/tp, H]`` row-parallel; input ``(E, ..., H)``), on torch einsum and nxd-tensor-parallel's
TP regions (``copy_to`` / ``reduce_from_tensor_model_parallel_region``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.distributed import ProcessGroup

from nxd_core_parallel import parallel_state
from nxd_tensor_parallel.parallel_layers.mappings import (
    copy_to_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region,
)
from nxd_tensor_parallel.parallel_layers.utils import divide, set_tensor_model_parallel_attributes

__all__ = ["ExpertFusedColumnParallelLinear", "ExpertFusedLinear", "ExpertFusedLinearWithAsyncCommunication",
           "ExpertFusedRowParallelLinear"]


class ExpertFusedLinearWithAsyncCommunication(torch.autograd.Function):
    """NxD's expert-fused matmul ``(E, ..., H) x (E, H, I) -> (E, ..., I)``; with
    ``async_grad_allreduce`` the input gradient is all-reduced over ``process_group`` (TP)."""

    @staticmethod
    def forward(ctx: Any, input: Tensor, weight: Tensor, bias: Tensor | None, async_grad_allreduce: bool,
                sequence_parallel_enabled: bool, sequence_dimension: int | None = 0, save_for_backward: bool = True,
                process_group: ProcessGroup | None = None, reduce_dtype: torch.dtype = torch.float32) -> Tensor:
        if bias is not None:
            raise NotImplementedError("Bias is not currently supported for MoE")
        if sequence_parallel_enabled:
            raise NotImplementedError("sequence parallelism (SP) is not supported for expert fused linear layers; "
                                      "exit SP before the expert linear layers (as NxD)")
        if input.shape[0] != weight.shape[0] and input.shape[0] > 1:
            raise RuntimeError(f"input and weight disagree on number of experts (first dimension). "
                               f"input_shape={tuple(input.shape)}, weight_shape={tuple(weight.shape)}")
        ctx.async_grad_allreduce = async_grad_allreduce
        ctx.compute_weight_gradient = weight.requires_grad
        ctx.process_group = process_group or parallel_state.get_tensor_model_parallel_group()
        if save_for_backward:
            ctx.save_for_backward(input, weight)
        return torch.einsum("e...h,ehi->e...i", input, weight)

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Tensor) -> tuple:
        input, weight = ctx.saved_tensors
        grad_output = grad_outputs[0]
        grad_input = torch.einsum("e...i,ehi->e...h", grad_output, weight)
        if ctx.async_grad_allreduce:
            torch.distributed.all_reduce(grad_input, group=ctx.process_group)
        grad_weight = torch.einsum("e...h,e...i->ehi", input, grad_output) if ctx.compute_weight_gradient else None
        return grad_input, grad_weight, None, None, None, None, None, None, None


class ExpertFusedLinear(torch.nn.Module):
    """NxD's base: marks its parameters ``expert_model_parallel`` when EP > 1 (nxd's grad
    reduction and checkpoints read that attribute)."""

    def _mark_expert_parallel_weights(self, iterable: Any = None, expert_parallel_group_size: int | None = None,
                                      is_prefill: bool = True, expert_distribution: Any = None) -> None:
        if expert_parallel_group_size is None:
            expert_parallel_group_size = parallel_state.get_expert_model_parallel_size()
        if expert_parallel_group_size > 1:
            for p in self.parameters() if iterable is None else iterable:
                p.expert_model_parallel = True
                if is_prefill:
                    p.is_prefill = True
                p.expert_distribution = expert_distribution


def _kaiming(weight: Tensor) -> None:
    torch.nn.init.kaiming_uniform_(weight, a=math.sqrt(5))  # NxD's default per expert


class _ExpertFusedParallel(ExpertFusedLinear):
    """The construction both NxD layers share: one 3-D weight (one linear per local expert) split
    over TP along ``partition_dim``, each expert initialised separately as NxD does."""

    def _build(self, num_experts: int, input_size: int, output_size: int, bias: bool, partition_dim: int,
               dtype: torch.dtype, device: torch.device | None, stride: int, init_method: Callable | None,
               keep_master_weight: bool, tensor_model_parallel_group: ProcessGroup | None,
               expert_model_parallel_group: ProcessGroup | None, is_prefill: bool, is_fused_gate_up: bool,
               expert_distribution: list[list[int]] | None) -> None:
        if keep_master_weight:
            raise NotImplementedError("ExpertFused*ParallelLinear(keep_master_weight=True) is not provided by "
                                      "nxd-compat (each rank initialises its own slice of every expert)")
        self.num_experts, self.input_size, self.output_size = num_experts, input_size, output_size
        self.tensor_parallel_group = tensor_model_parallel_group or parallel_state.get_tensor_model_parallel_group()
        ep_group = expert_model_parallel_group or parallel_state.get_expert_model_parallel_group()
        self.expert_model_parallel_group = ep_group
        self._n_local_experts = (divide(num_experts, ep_group.size()) if expert_distribution is None
                                 else len(expert_distribution[0]))
        self.is_prefill, self.is_fused_gate_up, self.arg_init_method = is_prefill, is_fused_gate_up, init_method
        tp = self.tensor_parallel_group.size()
        shape = [self._n_local_experts, input_size, output_size]
        shape[partition_dim] = divide(shape[partition_dim], tp)
        self.input_size_per_partition, self.output_size_per_partition = shape[1], shape[2]
        self.weight = torch.nn.Parameter(torch.empty(shape, dtype=dtype, device=device))
        set_tensor_model_parallel_attributes(self.weight, True, partition_dim, stride)
        for e in range(self._n_local_experts):
            (init_method or _kaiming)(self.weight.data[e])
        self.bias = torch.nn.Parameter(torch.empty(self._n_local_experts, shape[2], dtype=dtype,
                                                   device=device)) if bias else None
        if self.bias is not None:
            # NxD's bounds: column = fan_in of weight[e] ([H, I/tp] -> I/tp); row = its input slice I/tp
            bound = 1 / math.sqrt(shape[2] if partition_dim == 2 else shape[1])
            torch.nn.init.uniform_(self.bias, -bound, bound)
        self._mark_expert_parallel_weights(expert_parallel_group_size=ep_group.size(), is_prefill=is_prefill,
                                           expert_distribution=expert_distribution)

    def _experts(self, expert_indices: Tensor | None) -> tuple[Tensor, Tensor | None]:
        weight = self.weight if expert_indices is None else self.weight[expert_indices, :, :]
        bias = self.bias if expert_indices is None or self.bias is None else self.bias[expert_indices, :]
        # input (e, 1, c, h) or (e/ep, ep, c, h); bias (e, h): broadcast over the inner dims as NxD
        return weight, None if bias is None else bias.unsqueeze(1).unsqueeze(2)


class ExpertFusedColumnParallelLinear(_ExpertFusedParallel):
    autograd_func_class = ExpertFusedLinearWithAsyncCommunication

    def __init__(self, num_experts: int, input_size: int, output_size: int, bias: bool = False,
                 dtype: torch.dtype = torch.float32, device: torch.device | None = None, stride: int = 1,
                 init_method: Callable[..., Any] | None = None, keep_master_weight: bool = False,
                 tensor_model_parallel_group: ProcessGroup | None = None,
                 expert_model_parallel_group: ProcessGroup | None = None, is_prefill: bool = True,
                 is_fused_gate_up: bool = False, expert_distribution: list[list[int]] | None = None) -> None:
        super().__init__()
        self._build(num_experts, input_size, output_size, bias, 2, dtype, device, stride, init_method,
                    keep_master_weight, tensor_model_parallel_group, expert_model_parallel_group, is_prefill,
                    is_fused_gate_up, expert_distribution)
        self.gather_output, self.sequence_parallel_enabled = False, False
        # NxD all-reduces the input gradient inside the matmul's backward when TP > 1
        self.async_tensor_model_parallel_allreduce = self.tensor_parallel_group.size() > 1

    def forward(self, input_: Tensor, expert_indices: Tensor | None = None, *_: Any) -> Tensor:
        if not self.async_tensor_model_parallel_allreduce:
            input_ = copy_to_tensor_model_parallel_region(input_, process_group=self.tensor_parallel_group)
        weight, bias = self._experts(expert_indices)
        output = self.autograd_func_class.apply(input_, weight, None, self.async_tensor_model_parallel_allreduce,
                                                False, 0, True, self.tensor_parallel_group)
        return output if bias is None else output + bias


class ExpertFusedRowParallelLinear(_ExpertFusedParallel):
    """NxD's note holds: with ``reduce_output=False`` and a bias, the bias must be divided by TP."""

    autograd_func_class = ExpertFusedLinearWithAsyncCommunication

    def __init__(self, num_experts: int, input_size: int, output_size: int, bias: bool = False,
                 reduce_output: bool = True, dtype: torch.dtype = torch.float32, device: torch.device | None = None,
                 stride: int = 1, init_method: Callable[..., Any] | None = None, keep_master_weight: bool = False,
                 tensor_model_parallel_group: ProcessGroup | None = None,
                 expert_model_parallel_group: ProcessGroup | None = None, is_prefill: bool = True,
                 is_fused_gate_up: bool = False, expert_distribution: list[list[int]] | None = None) -> None:
        super().__init__()
        self._build(num_experts, input_size, output_size, bias, 1, dtype, device, stride, init_method,
                    keep_master_weight, tensor_model_parallel_group, expert_model_parallel_group, is_prefill,
                    is_fused_gate_up, expert_distribution)
        self.input_is_parallel, self.reduce_output, self.sequence_parallel_enabled = True, reduce_output, False

    def forward(self, input_: Tensor, expert_indices: Tensor | None = None) -> Tensor:
        weight, bias = self._experts(expert_indices)
        output = self.autograd_func_class.apply(input_, weight, None, False, False, 0, True, self.tensor_parallel_group)
        if self.reduce_output:
            output = reduce_from_tensor_model_parallel_region(output, process_group=self.tensor_parallel_group)
        return output if bias is None else output + bias
