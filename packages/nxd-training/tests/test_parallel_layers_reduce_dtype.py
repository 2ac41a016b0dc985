"""``precision.parallel_layers_reduce_dtype`` reaches the tensor-parallel layers with NxDT's
defaults: fp32 runs reduce in fp32 unless the key says bf16; bf16 runs in bf16 unless it says fp32."""

from __future__ import annotations

import pytest
import torch

from nxd_training.config.schema import PrecisionConfig
from nxd_training.precision import parallel_layers_reduce_dtype, set_parallel_layers_reduce_dtype


@pytest.mark.parametrize(("ptype", "key", "expected"), [
    ("fp32", None, torch.float32), ("fp32", "bf16", torch.bfloat16), ("fp32", "fp32", torch.float32),
    ("mixed_precision", None, torch.bfloat16), ("mixed_precision", "fp32", torch.float32),
    ("bf16SR", None, torch.bfloat16), ("autocast", None, torch.bfloat16), ("autocast", "fp32", torch.float32),
])
def test_nxdt_rule(ptype, key, expected):
    precision = PrecisionConfig(type=ptype, parallel_layers_reduce_dtype=key)
    assert parallel_layers_reduce_dtype(precision) == expected


def test_every_parallel_layer_gets_it():
    from nxd_core_parallel.parallel_layers import ColumnParallelLinear, RowParallelLinear

    model = torch.nn.Sequential(ColumnParallelLinear(4, 8, gather_output=False), torch.nn.ReLU(),
                                RowParallelLinear(8, 4, input_is_parallel=True), torch.nn.Linear(4, 4))
    assert set_parallel_layers_reduce_dtype(model, torch.bfloat16) == 2
    assert model[0].reduce_dtype == model[2].reduce_dtype == torch.bfloat16
