"""neuronx_distributed_config returns the typed, resolved config (still NxD's dict)."""

from __future__ import annotations

import pickle

import pytest

import nxd
from nxd.resolved import ModelInitConfig, NxdConfig, OptimizerConfig
from nxd.run_config import RunConfig


def test_the_config_is_typed_and_still_nxd_dict():
    config = nxd.neuronx_distributed_config(tensor_parallel_size=1, sequence_parallel=True,
                                            optimizer_config={"max_grad_norm": 0.5})
    assert isinstance(config, NxdConfig) and isinstance(config, dict)
    assert config.tensor_parallel_size == config["tensor_parallel_size"] == 1
    assert config.sequence_parallel is True and config.context_parallel_size == 1
    assert config.optimizer == OptimizerConfig(zero_one_enabled=False, max_grad_norm=0.5)
    assert config["optimizer_config"]["max_grad_norm"] == 0.5
    assert config.model_init == ModelInitConfig() and config.data_parallel_strategy == "ddp"
    assert config.sizes() == {"tp": 1, "pp": 1, "cp": 1, "ep": 1}
    assert pickle.loads(pickle.dumps(config)) == config and type(pickle.loads(pickle.dumps(config))) is NxdConfig
    with pytest.raises(AttributeError, match="read-only"):
        config.tensor_parallel_size = 2


def test_a_partial_dict_answers_every_attribute_with_the_defaults():
    partial = NxdConfig.of({"optimizer_config": {"zero_one_enabled": True}})
    assert partial.data_parallel_strategy == "zero1" and partial.optimizer.max_grad_norm == 1.0
    assert partial.pipeline_parallel_size == 1 and partial.pipeline_config == {} and partial.lora_config is None
    assert NxdConfig.of(None) == {} and NxdConfig.of(partial) is partial


def test_nxd_dict_is_an_adapter_over_one_typed_run_config():
    # NxD's two clipping keys are one value downstream: the norm, None for no clipping
    off = nxd.neuronx_distributed_config(optimizer_config={"grad_clipping": False})
    assert off["optimizer_config"]["grad_clipping"] is False and off.run.optimizer.max_grad_norm is None
    assert RunConfig.of(off) is off.run and RunConfig.of(off.run) is off.run
    assert RunConfig.of({"optimizer_config": {"grad_clipping": False}}).optimizer.max_grad_norm is None
    run = nxd.neuronx_distributed_config(tensor_parallel_size=1, activation_checkpoint_config="full").run
    # written to a run folder and read back as the same typed config
    assert RunConfig.from_record(run.to_record(), {}, "run.json") == run
    with pytest.raises(nxd.ConfigError, match="max_grad_norm must be a positive number"):
        OptimizerConfig(max_grad_norm=0.0)


def test_what_a_config_leaves_out_is_filled_in_one_place():
    """``RunConfig.for_context``: a config silent on sequence parallelism takes the model's own
    setting (its constructor built it for one); a stated one, or a full RunConfig, keeps its own. A class
    default (a plain family's ``PlacedByPlan``, placed later by its plan) is no setting of the model's."""

    class BuiltForSP:
        def __init__(self) -> None:
            self.sequence_parallel = True

    class PlacedLater:
        sequence_parallel = True  # a class default: the plan sets the instance's

    model = BuiltForSP()
    assert RunConfig.for_context(None, None, PlacedLater()).sequence_parallel is False
    assert RunConfig.for_context(None, None, model).sequence_parallel is True
    assert RunConfig.for_context({"tensor_parallel_size": 1}, None, model).sequence_parallel is True
    assert RunConfig.for_context({"sequence_parallel": False}, None, model).sequence_parallel is False
    assert RunConfig.for_context(RunConfig(), None, model).sequence_parallel is False
    assert RunConfig.for_context({}, None, object()).sequence_parallel is False  # no setting of its own


def test_derived_numbers_are_checked_against_the_layout_and_round_trip():
    from nxd.errors import ConfigError
    from nxd.run_config import Derived, Parallelism

    derived = Derived(architecture="m", architecture_reason="model.architecture", model={"h": 1}, world_size=4, dp=2,
                      num_microbatches=2, seq_length=8, data_module="indexed", data={"seq_length": 8}, notes=["n"])
    run = RunConfig(parallel=Parallelism(tp=2), derived=derived)
    assert RunConfig.from_record(run.to_record(), {}, "test") == run and run.derived.notes == ("n",)
    with pytest.raises(ConfigError, match="derived.world_size=4 is not DP 2 x TP 1"):
        RunConfig(derived=derived)
