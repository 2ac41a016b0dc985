"""Shared fixtures: a tokenizer trained once on the embedded corpus, a tiny Llama config.json, and
the synthetic preference set (``pairs_file``) is nxd-testing's pytest plugin's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

VOCAB = 512
#: the 8B config.json NxDT points at, shrunk to a tiny model (what model.model_config names)
TINY_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": VOCAB, "hidden_size": 32,
              "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu",
              "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2}


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from nxd_data.quickstart import prepare_quickstart_data

    return prepare_quickstart_data(tmp_path_factory.mktemp("corpus"), vocab_size=VOCAB)


@pytest.fixture(scope="session")
def tiny_json(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("tiny_llama") / "config.json"
    path.write_text(json.dumps(TINY_LLAMA))
    return str(path)


CONF = Path(__file__).parent / "configs"
DPO = str(CONF / "hf_llama3_8B_DPO_config.yaml")
ORPO = str(CONF / "hf_llama3_8B_ORPO_config.yaml")

#: size and learning-rate overrides only (NxDT's beta/lr are for an 8B model over thousands of steps)
SHRINK = ["trainer.num_nodes=1", "trainer.max_steps=12", "trainer.log_every_n_steps=1",
          "trainer.enable_progress_bar=false", "trainer.accelerator=cpu", "data.global_batch_size=8",
          "data.micro_batch_size=2", "data.seq_length=32", "model.encoder_seq_length=32", "model.num_layers=2",
          "model.hidden_size=32", "model.max_position_embeddings=64", "model.optim.lr=0.003",
          "model.optim.sched.warmup_steps=1", "model.optim.sched.max_steps=12",
          "exp_manager.create_tensorboard_logger=false", "exp_manager.resume_from_checkpoint=null",
          "precision.type=fp32"]


def config_overrides(source: str, pairs: str, tokenizer: str, tiny_json: str, exp_dir: Path, *, devices: int, tp: int,
                     extra: list[str] = ()) -> list[str]:
    """Point NxDT's paths at local files, shrink the run, then ``extra``."""
    paths = [f"data.train_dir={pairs}", f"data.tokenizer.type={tokenizer}", f"model.model_config={tiny_json}",
             f"exp_manager.exp_dir={exp_dir}"]
    workflow = ["model_alignment_strategy.dpo.kl_beta=0.1"] if source == DPO else []
    key = "dpo" if source == DPO else "orpo"
    return [*paths, *SHRINK, f"model_alignment_strategy.{key}.max_prompt_length=16", *workflow,
            f"trainer.devices={devices}", f"distributed_strategy.tensor_model_parallel_size={tp}", *extra]


@pytest.fixture(scope="session")
def args_for(corpus: dict[str, str], pairs_file: str, tiny_json: str):
    """``args_for(source, exp_dir, devices=, tp=, extra=)``: the overrides of a shrunk NxDT config."""

    def make(source: str, exp_dir: Path, *, devices: int, tp: int, extra: list[str] = ()) -> list[str]:
        return config_overrides(source, pairs_file, corpus["tokenizer"], tiny_json, exp_dir, devices=devices, tp=tp,
                                extra=list(extra))

    return make
