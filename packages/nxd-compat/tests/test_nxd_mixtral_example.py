"""NxD's Mixtral pretraining example (``mixtral_pretrain/run_mixtral_pretrain_ptl.py`` with its
``module_mixtral.py`` and ``data_module.py`` and the shared ``modeling_mixtral_moe_nxd.py``,
``training_utils.py``, ``lr.py``, vendored unchanged) in the environment its requirements.txt pins
(transformers 4.48, Lightning), through ``nxd-compat-run``: the model's MoE layers are built with
NxD's MoE API (``RouterTopK``, ``ExpertMLPs``, ``MoE``) and trained by nxd-lightning.

A tiny ``config.json`` (given by ``--model_path``, as the script's .sh does with its configs) and a
tokenized dataset are ours. ``--use_zero_1`` as the .sh sets it (NxD's mixed-precision config needs
it). TP=2 against the same script in one process: per-step losses within 1e-5 relative (fp32; the
example's init is NxD's master-weight init, which is the same model at every TP degree).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from example_run import MAKE_DATA, rel, torchrun

EXAMPLE = Path(__file__).parent / "nxd_examples" / "mixtral"
SCRIPT, STEPS = "run_mixtral_pretrain_ptl.py", 3
TINY_MIXTRAL = """{"architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
 "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 128,
 "max_position_embeddings": 64, "model_type": "mixtral", "num_attention_heads": 4, "num_experts_per_tok": 2,
 "num_hidden_layers": 2, "moe_frequency": 1, "num_key_value_heads": 4, "num_local_experts": 4,
 "output_router_logits": true, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
 "sliding_window": null, "tie_word_embeddings": false, "use_cache": false, "vocab_size": 128, "pretraining_tp": 1,
 "use_flash_attention": false}"""
COMMON = ("--model_path", "tiny_mixtral", "--data_dir", "data", "--batch_size", "2", "--max_steps", str(STEPS),
          "--steps_this_run", str(STEPS), "--warmup_steps", "1", "--lr", "1e-3", "--seq_len", "32", "--use_zero_1")


@pytest.fixture(scope="module")
def workdir(legacy_python, tmp_path_factory):
    run = tmp_path_factory.mktemp("mixtral") / "run"
    run.mkdir()
    for path in [*EXAMPLE.glob("*.py"), *(EXAMPLE / "mixtral_pretrain").glob("*.py")]:
        shutil.copy(path, run / path.name)  # side by side, as the example's .sh runs them
    (run / "tiny_mixtral").mkdir()
    (run / "tiny_mixtral" / "config.json").write_text(TINY_MIXTRAL)
    subprocess.run([str(legacy_python), "-c", MAKE_DATA, str(run / "data")], check=True, capture_output=True)
    return legacy_python, run


def train(python: Path, run: Path, tp: int) -> list[float]:
    done = torchrun(python, run, tp, SCRIPT, *COMMON, "--tensor_parallel_size", str(tp), "--log_dir", f"logs_tp{tp}")
    return [float(x) for x in re.findall(r"step \d+ loss is ([0-9.eE+-]+)", done.stdout)]


@pytest.mark.slow
def test_mixtral_example_tp2_matches_one_process(workdir):
    python, run = workdir
    reference = train(python, run, 1)
    losses = train(python, run, 2)
    assert len(reference) == STEPS and len(losses) == STEPS
    print(f"\nMixtral example TP=2 + ZeRO-1 losses {losses} vs one process {reference}: max rel {rel(losses, reference):.2e}")
    assert rel(losses, reference) <= 1e-5
