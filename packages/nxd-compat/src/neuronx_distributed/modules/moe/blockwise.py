"""``neuronx_distributed.modules.moe.blockwise``: NxD's torch reference of its blockwise expert
matmul (``TorchBlockwiseTraining``: tokens laid out in per-expert blocks of ``token_position_to_id``,
-1 = padding; SiLU-GLU experts; NxD's hand-written backward) and its two torch helpers. NxD's
XLA ``dynamic_slice_*`` and ``mark_step`` calls are plain indexing here (the same values); the NKI
kernels and their argument holder stay refused (``_not_provided``)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from neuronx_distributed.modules.moe._not_provided import module_getattr

_PADDING = -1  # NxD's model_utils.DEFAULT_PADDING_VALUE: an empty slot of a block

__all__ = ["TorchBlockwiseTraining", "augment_inputs_for_padded_blockwise_matmul", "get_data"]


def get_data(tensor: torch.Tensor | None, transform: Callable | None = None) -> torch.Tensor | None:
    """``tensor.data`` (transformed), or None for None."""
    if tensor is None:
        return None
    return transform(tensor.data) if transform else tensor.data


def augment_inputs_for_padded_blockwise_matmul(
        output: torch.Tensor, hidden_states: torch.Tensor, token_position_to_id: torch.Tensor,
        expert_affinities_masked: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """NxD's: one zero row appended to output / hidden states / affinities, and padding slots (-1)
    pointed at it (``T``)."""
    total_tokens, hidden_size = hidden_states.shape
    pad = torch.zeros(1, hidden_size, device=hidden_states.device, dtype=hidden_states.dtype)
    expert_pad = torch.zeros(1, expert_affinities_masked.shape[1], device=hidden_states.device,
                             dtype=hidden_states.dtype)
    positions = token_position_to_id.masked_fill(token_position_to_id == _PADDING, total_tokens)
    return (torch.cat([output, pad]), torch.cat([hidden_states, pad.clone()]), positions,
            torch.cat([expert_affinities_masked, expert_pad]))


class TorchBlockwiseTraining(torch.autograd.Function):
    """NxD's blockwise matmul with selective activation: ``hidden_states (T, H)``,
    ``expert_affinities_masked (T, E)``, ``token_position_to_id (N*B,)``, ``block_to_expert (N,)``,
    ``gate_up_weight (E, H, 2I)`` (gate | up), ``down_weight (E, I, H)`` -> ``(T, H)``."""

    @staticmethod
    def forward(ctx, hidden_states, expert_affinities_masked, token_position_to_id, block_to_expert,
                gate_up_weight, down_weight):
        ctx.num_blocks = num_blocks = block_to_expert.shape[0]
        total_tokens, hidden_size = hidden_states.shape
        block_size = token_position_to_id.shape[0] // num_blocks
        # an extra row receives the padding slots' (-1) output, dropped at the end
        output = torch.zeros(total_tokens + 1, hidden_size, device=hidden_states.device, dtype=hidden_states.dtype)
        block_to_token_indices = token_position_to_id.view(num_blocks, block_size)
        gate_up_activations = torch.empty(num_blocks, block_size, gate_up_weight.shape[2],
                                          dtype=gate_up_weight.dtype, device=gate_up_weight.device)
        down_activations = torch.empty(num_blocks, block_size, hidden_size, dtype=down_weight.dtype,
                                       device=down_weight.device)
        for block_idx in range(num_blocks):
            tokens, expert = block_to_token_indices[block_idx], block_to_expert[block_idx]
            gate_up_activation = hidden_states[tokens] @ gate_up_weight[expert]
            gate_up_activations[block_idx] = gate_up_activation
            gate, up = torch.chunk(gate_up_activation, chunks=2, dim=-1)
            down_activation = (F.silu(gate) * up) @ down_weight[expert]
            down_activations[block_idx] = down_activation
            output[tokens] += down_activation * expert_affinities_masked[tokens][:, expert:expert + 1]
        ctx.save_for_backward(hidden_states, expert_affinities_masked, block_to_token_indices, block_to_expert,
                              gate_up_weight, down_weight, gate_up_activations, down_activations)
        return output[:total_tokens, :]

    @staticmethod
    def backward(ctx, grad_output):
        (hidden_states, expert_affinities_masked, block_to_token_indices, block_to_expert, gate_up_weight,
         down_weight, gate_up_activations, down_activations) = ctx.saved_tensors
        T, E = expert_affinities_masked.shape
        H = hidden_states.shape[-1]
        # a last row for the -1 slots: they take a zero gradient and their gradients are dropped
        hidden_states_grad = torch.zeros(T + 1, H, device=hidden_states.device, dtype=hidden_states.dtype)
        affinities_grad = torch.zeros(T + 1, E, device=expert_affinities_masked.device,
                                      dtype=expert_affinities_masked.dtype)
        down_weight_grad, gate_up_weight_grad = torch.zeros_like(down_weight), torch.zeros_like(gate_up_weight)
        grad_output_padded = torch.cat([grad_output, grad_output.new_zeros(1, H)], dim=0)
        for block_idx in range(ctx.num_blocks):
            tokens, expert = block_to_token_indices[block_idx], block_to_expert[block_idx]
            block_grad = grad_output_padded[tokens]
            # affinities: d/da of a * down_activation
            block_affinities_grad = torch.zeros(block_grad.shape[0], E, device=block_grad.device)
            block_affinities_grad[:, expert] = (block_grad * down_activations[block_idx]).sum(dim=1)
            affinities_grad[tokens] += block_affinities_grad
            down_out_grad = block_grad * expert_affinities_masked[tokens][:, expert:expert + 1]
            # recompute the GLU from the saved gate/up projection
            gate, up = torch.chunk(gate_up_activations[block_idx], chunks=2, dim=-1)
            silu = F.silu(gate)
            down_weight_grad[expert] += (silu * up).t() @ down_out_grad
            first_dot_grad = down_out_grad @ down_weight[expert].t()
            sig = torch.sigmoid(gate)
            gate_grad = first_dot_grad * up * sig * (1 + gate * (1 - sig))
            gate_up_out_grad = torch.cat([gate_grad, first_dot_grad * silu], dim=-1)
            gate_up_weight_grad[expert] += hidden_states[tokens].t() @ gate_up_out_grad
            # accumulate: one token goes to several experts
            hidden_states_grad[tokens] += gate_up_out_grad @ gate_up_weight[expert].t()
        return hidden_states_grad[:T], affinities_grad[:T], None, None, gate_up_weight_grad, down_weight_grad


__getattr__ = module_getattr(__name__)
