"""``precision.parallel_layers_reduce_dtype`` reaches the NxD config (whose parallel plan gives it
to the tensor-parallel layers) with NxDT's defaults: fp32 runs reduce in fp32 unless the key says bf16; bf16 runs in bf16 unless it says fp32."""

from __future__ import annotations

import pytest
import torch

from nxd_training.config.nxdt.precision import parallel_layers_reduce_dtype
from nxd_training.config.schema import PrecisionConfig


@pytest.mark.parametrize(("ptype", "key", "expected"), [
    ("fp32", None, torch.float32), ("fp32", "bf16", torch.bfloat16), ("fp32", "fp32", torch.float32),
    ("mixed_precision", None, torch.bfloat16), ("mixed_precision", "fp32", torch.float32),
    ("bf16SR", None, torch.bfloat16), ("autocast", None, torch.bfloat16), ("autocast", "fp32", torch.float32),
    # NxDT lower-cases the name (its get_dtype): the YAML may say FP32 / BF16
    ("mixed_precision", "FP32", torch.float32), ("fp32", "BF16", torch.bfloat16),
])
def test_nxdt_rule(ptype, key, expected):
    precision = PrecisionConfig(type=ptype, parallel_layers_reduce_dtype=key)
    assert parallel_layers_reduce_dtype(precision) == expected


def test_other_names_are_refused_naming_the_key():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="parallel_layers_reduce_dtype"):
        PrecisionConfig(parallel_layers_reduce_dtype="FP64")


def test_the_nxd_config_carries_it():
    """The one NxD config every transform reads names it (the parallel plan gives it to the layers)."""
    import nxd

    assert nxd.neuronx_distributed_config(parallel_layers_reduce_dtype=torch.bfloat16).parallel_layers_reduce_dtype \
        == torch.bfloat16
    assert nxd.neuronx_distributed_config().parallel_layers_reduce_dtype is None
