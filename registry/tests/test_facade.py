"""The NxD facade validates input before anything runs and names the plugin a feature needs."""

from __future__ import annotations

import pytest
import torch

import nxd


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tensor_parallel_size": 0}, "tensor_parallel_size must be a positive integer, got 0"),
        ({"pipeline_parallel_size": 1.5}, "pipeline_parallel_size must be a positive integer, got 1.5"),
        ({"tensor_parallel_size": True}, "tensor_parallel_size must be a positive integer, got True"),
        ({"optimizer_config": {"max_grad_nrm": 1.0}}, "optimizer_config has unknown key 'max_grad_nrm' \\(did you mean 'max_grad_norm'\\?\\)"),
        ({"optimizer_config": {"max_grad_norm": -1}}, "optimizer_config.max_grad_norm must be a positive number, got -1"),
        ({"optimizer_config": {"grad_clipping": "yes"}}, "optimizer_config.grad_clipping must be True or False"),
        ({"optimizer_config": []}, "optimizer_config must be a dict, got list"),
        ({"model_init_config": {"sequential_move_factor": 64}}, "sequential_move_factor must be an integer in 1..32, got 64"),
        ({"model_init_config": {"meta_device_init": True}}, "param_init_fn must be a callable when meta_device_init is True"),
        ({"activation_checkpoint_config": "some"}, "activation_checkpoint_config must be None, 'full', 'op' .*, or an nn.Module class"),
        ({"sequence_parallel": 2}, "sequence_parallel must be True or False, got 2"),  # 0/1 (NxD CLI ints) are accepted
        ({"mixed_precision_config": {"use_master_weights": True}}, "use_master_weights=True needs optimizer_config.zero_one_enabled=True"),
        ({"context_parallel_size": 0}, "context_parallel_size must be a positive integer, got 0"),
    ],
)
def test_bad_config_names_the_field(kwargs, message):
    with pytest.raises(nxd.ConfigError, match=message):
        nxd.neuronx_distributed_config(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"pipeline_parallel_size": 2}, "pipeline_parallel_size=2 needs the pipeline schedule '1f1b': pip install nxd-pipeline"),
        ({"pipeline_parallel_size": 2, "pipeline_config": {"schedule": "gpipe"}}, "schedule 'gpipe': pip install nxd-pipeline"),
        ({"optimizer_config": {"zero_one_enabled": True}}, "zero_one_enabled=True needs the model transform 'zero1': pip install nxd-zero1"),
        ({"lora_config": object()}, "lora_config needs the adapter 'lora': pip install nxd-lora"),
    ],
)
def test_feature_without_its_plugin_names_the_package(kwargs, message):
    with pytest.raises(nxd.ComponentNotFound, match=message):
        nxd.neuronx_distributed_config(**kwargs)


def test_defaults_match_nxd():
    config = nxd.neuronx_distributed_config()
    assert config["optimizer_config"] == {"zero_one_enabled": False, "grad_clipping": True, "max_grad_norm": 1.0}
    assert config["model_init_config"] == {"sequential_move_factor": 11, "meta_device_init": False, "param_init_fn": None}
    assert (config["tensor_parallel_size"], config["pipeline_parallel_size"], config["sequence_parallel"]) == (1, 1, False)


def test_model_and_optimizer_need_the_parallel_runtime():
    config = nxd.neuronx_distributed_config()
    with pytest.raises(nxd.ComponentNotFound, match="pip install nxd-core-parallel"):
        nxd.initialize_parallel_model(config, lambda: torch.nn.Linear(2, 2))
    with pytest.raises(nxd.ComponentNotFound, match="data_parallel_strategy='ddp' needs the model transform 'ddp': pip install nxd-core-parallel"):
        nxd.initialize_parallel_optimizer(config, torch.optim.SGD, [torch.nn.Parameter(torch.ones(1))], lr=0.1)


def test_facade_rejects_foreign_config_and_bad_arguments():
    with pytest.raises(nxd.ConfigError, match="must be the dict returned by nxd.neuronx_distributed_config"):
        nxd.initialize_parallel_model({"tensor_parallel_size": 1}, torch.nn.Linear, 2, 2)
    config = nxd.neuronx_distributed_config()
    with pytest.raises(nxd.ConfigError, match="model_fn must be a callable"):
        nxd.initialize_parallel_model(config, "not callable")
    with pytest.raises(nxd.ConfigError, match="optimizer_class must be a torch.optim.Optimizer subclass"):
        nxd.initialize_parallel_optimizer(config, dict, [])


def test_checkpoint_api_needs_the_checkpoint_plugin(tmp_path):
    with pytest.raises(nxd.ComponentNotFound, match="needs the checkpoint engine 'default': pip install nxd-ckpt"):
        nxd.save_checkpoint(str(tmp_path), tag="step1")
    with pytest.raises(nxd.ComponentNotFound, match="pip install nxd-ckpt"):
        nxd.has_checkpoint(str(tmp_path))
