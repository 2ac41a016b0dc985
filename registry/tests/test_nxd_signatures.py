"""NxD's current signatures and defaults on the facade (no parallel runtime needed)."""

from __future__ import annotations

import pytest
import torch

import nxd


def test_mixed_precision_config_defaults_follow_zero1():
    plain = nxd.neuronx_distributed_config()
    assert plain["mixed_precision_config"] == {"use_master_weights": False, "use_fp32_grad_acc": False,
                                               "use_master_weights_in_ckpt": False}
    partial = nxd.neuronx_distributed_config(mixed_precision_config={"use_master_weights_in_ckpt": False})
    assert partial["mixed_precision_config"]["use_master_weights"] is False


def test_mixed_precision_master_weights_without_zero1_is_refused_before_launch():
    with pytest.raises(nxd.ConfigError, match="use_master_weights=True needs optimizer_config.zero_one_enabled"):
        nxd.neuronx_distributed_config(mixed_precision_config={"use_master_weights": True})


def test_include_buffers_is_the_third_argument():
    config = nxd.neuronx_distributed_config()
    with pytest.raises(nxd.ConfigError, match=r"third argument is include_buffers .* got 4"):
        nxd.initialize_parallel_model(config, torch.nn.Linear, 4, 2)
