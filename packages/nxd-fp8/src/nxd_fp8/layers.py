"""nxd's tensor-parallel layers with their local matmul in FP8 through torchao's float8 matmul.

The layers keep their communication (the sequence-parallel all-gather, the TP reductions) in high
precision and run the matmul on this rank's shard in FP8 with scales of the shard (tensorwise: one
scale per shard, rowwise: per row of it). Conversion swaps the module's class to a subclass (as
FSDP2's ``fully_shard`` does), so parameters, their names, hooks and checkpoints are unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch
from torchao.float8 import Float8LinearConfig
from torchao.float8.float8_linear import Float8Linear, matmul_with_hp_or_float8_args

from nxd_fp8.options import Fp8Options
from nxd_tensor_parallel.modules.qkv_linear import GQAQKVColumnParallelLinear
from nxd_tensor_parallel.parallel_layers import ColumnParallelLinear, LocalLinear, RowParallelLinear


def torchao_config(options: Fp8Options) -> Float8LinearConfig:
    """torchao's config for the options' recipe (emulated when asked)."""
    return dataclasses.replace(Float8LinearConfig.from_recipe_name(options.recipe), emulate=options.emulate)


def _mm_config(config: Float8LinearConfig) -> Any:
    # the matmul settings torchao derives from a config (fast accumulation per GEMM, emulation),
    # taken from a Float8Linear on the meta device so they are torchao's, not a copy of them
    return Float8Linear(16, 16, bias=False, config=config, device="meta").linear_mm_config


class Float8LocalLinear(LocalLinear):
    """``local_linear`` through torchao's float8 matmul (what ``Float8Linear.forward`` does)."""

    float8_config: Float8LinearConfig
    float8_mm_config: Any

    def local_linear(self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        device = x.device.type
        # autocast does not reach inside the custom matmul; a device type without autocast (meta: the
        # plan's dry run) has none to follow
        if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device):
            x = x.to(torch.get_autocast_dtype(device))
        out = matmul_with_hp_or_float8_args.apply(x, weight.t(), self.float8_mm_config, self.float8_config)
        return out if bias is None else out + bias.to(out.dtype)


class Float8ColumnParallelLinear(Float8LocalLinear, ColumnParallelLinear):
    pass


class Float8RowParallelLinear(Float8LocalLinear, RowParallelLinear):
    pass


class Float8GQAQKVColumnParallelLinear(Float8LocalLinear, GQAQKVColumnParallelLinear):
    pass


#: each nxd parallel layer -> its FP8 twin
FLOAT8_CLASSES: dict[type, type] = {
    ColumnParallelLinear: Float8ColumnParallelLinear,
    RowParallelLinear: Float8RowParallelLinear,
    GQAQKVColumnParallelLinear: Float8GQAQKVColumnParallelLinear,
}


def local_weights(module: torch.nn.Module) -> list[torch.Tensor]:
    """The weight shards the layer multiplies by (GQA QKV unfused: one per projection)."""
    if isinstance(module, GQAQKVColumnParallelLinear):
        names = ("weight_qkv",) if module.fuse_qkv else ("weight_q", "weight_k", "weight_v")
        return [getattr(module, n) for n in names]
    return [module.weight]


def to_float8(module: torch.nn.Module, config: Float8LinearConfig) -> None:
    """Turn a parallel layer into its FP8 twin, in place."""
    module.__class__ = FLOAT8_CLASSES[type(module)]
    module.float8_config = config
    module.float8_mm_config = _mm_config(config)
