"""``nxd train`` of an NxD Training Mixtral config (hf_mixtral_8x7b_dropless_config.yaml's
``model.moe`` section and ``expert_model_parallel_size``, at tiny size) on 2 gloo ranks: EP=2 learns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

#: hf_mixtral_8x7b_dropless_config.yaml's model.moe section, unchanged (aws-neuron/neuronx-distributed-training,
#: examples/conf, Apache-2.0) except num_experts (8 -> 4 for the tiny model)
NXDT_DROPLESS_MOE = {"num_experts": 4, "frequency": 1, "dropout": 0.0, "capacity_factor": 0.0, "dropless": True,
                     "routing_algorithm": "top_k", "top_k": 2, "output_router_logits": True,
                     "router_aux_loss_coef": 0.02, "normalize_top_k_affinities": True}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from nxd_data.quickstart import prepare_quickstart_data

    return prepare_quickstart_data(tmp_path_factory.mktemp("corpus"), vocab_size=512)


def mixtral_config(corpus: dict[str, str], exp_dir: Path, ep: int) -> dict[str, Any]:
    return {
        "name": "hf_mixtral_dropless", "model_source": "hf", "seed": 1234,
        "trainer": {"devices": 2, "max_steps": 12, "log_every_n_steps": 1, "val_check_interval": 0,
                    "limit_val_batches": 0, "gradient_clip_val": 1.0, "enable_progress_bar": False,
                    "accelerator": "cpu"},
        "exp_manager": {"exp_dir": str(exp_dir), "create_checkpoint_callback": False,
                        "create_tensorboard_logger": False},
        "distributed_strategy": {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
                                 "zero1": False, "sequence_parallel": False, "expert_model_parallel_size": ep},
        "data": {"module": "indexed", "data_prefix": corpus["data_prefix"], "tokenizer": corpus["tokenizer"],
                 "micro_batch_size": 2, "global_batch_size": 4, "seq_length": 32, "splits_string": "950,50,0"},
        "model": {"vocab_size": 512, "hidden_size": 32, "ffn_hidden_size": 48, "num_layers": 2,
                  "num_attention_heads": 4, "num_kv_heads": 2, "max_position_embeddings": 64, "rope_theta": 1e6,
                  "moe": dict(NXDT_DROPLESS_MOE),
                  "optim": {"name": "adamw", "lr": 1e-2, "sched": {"name": "constant"}}},
        "precision": {"type": "fp32"},
    }


def _train(config: dict[str, Any], log_dir: str) -> dict[int, float]:
    from nxd_training.config import load_config
    from nxd_training.loop import train

    return dict(train(load_config(config), log_dir=log_dir).losses)


def test_nxdt_mixtral_config_validates_and_selects_mixtral(corpus, tmp_path):
    from nxd_training.config import load_config
    from nxd_training.config.plan import make_plan

    plan = make_plan(load_config(mixtral_config(corpus, tmp_path, ep=2)))
    assert plan.spec.name == "mixtral"
    moe = plan.model_config.moe_config()
    assert (moe.num_experts, moe.top_k, moe.dropless, moe.router_aux_loss_coef) == (4, 2, True, 0.02)
    assert plan.model_config.output_router_logits


@pytest.mark.slow
def test_ep2_run_learns(rank_pool, corpus, tmp_path):
    config = mixtral_config(corpus, tmp_path / "runs", ep=2)
    losses = rank_pool(2).run(_train, config, str(tmp_path / "ep2"), timeout=900)
    assert losses[0] == losses[1]
    first, last = (losses[0][1] + losses[0][2]) / 2, (losses[0][11] + losses[0][12]) / 2
    print(f"\nEP=2 nxd train: loss {first:.3f} -> {last:.3f}")
    assert last < first - 0.5, f"loss did not fall: {first:.3f} -> {last:.3f}"
