"""NxD's TP/PP Llama pretraining script (``tp_pp_llama_hf_pretrain/run_llama_nxd.py``, vendored
unchanged) on two gloo ranks as a 2-stage pipeline through ``nxd-compat-run``: its model is NxD's
``modeling_llama_nxd.LlamaForCausalLM``, a transformers ``LlamaForCausalLM`` subclass with no nxd
pipeline methods, cut by nxd-pipeline's Hugging Face decoder layout with the script's
``auto_partition=True``, trained with ZeRO-1 and 2 micro-batches. Its per-step losses must equal
the same script in one process (fp32, 1e-5 relative).

Both runs start from one checkpoint (``--pretrained_weight 1``, written by
``make_pretrained_weight.py``): the script seeds each pipeline stage differently by design.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from example_run import prepare, rel, step_losses, torchrun

pytestmark = pytest.mark.launch  # every test here trains through a launch

SCRIPT, STEPS = "run_llama_nxd.py", 3
COMMON = ("--training_config", "tiny_llama", "--training_dir", "data", "--max_steps", str(STEPS), "--seq_len", "32",
          "--tensor_parallel_size", "1", "--num_microbatches", "2", "--train_batch_size", "4", "--lr", "1e-3",
          "--warmup_steps", "1", "--constant_steps", "0", "--min_lr", "1e-4", "--use_sequence_parallel", "0",
          "--use_zero1_optimizer", "1", "--pretrained_weight", "1", "--checkpoint_dir", "ckpt")


def train(python: Path, run: Path, pp: int) -> list[float]:
    name = f"pp{pp}"
    torchrun(python, run, pp, SCRIPT, *COMMON, "--pipeline_parallel_size", str(pp), "--tb_dir", name,
             "--metrics_file", f"{name}/results.json")
    return step_losses(run / name)


@pytest.mark.slow
def test_pp2_zero1_hf_llama_matches_one_process(legacy_python, tmp_path):
    run = prepare(legacy_python, tmp_path / "run", "tp_pp_llama_hf_pretrain")
    shutil.copy(Path(__file__).parent / "make_pretrained_weight.py", run)
    torchrun(legacy_python, run, 1, "make_pretrained_weight.py", "tiny_llama", "ckpt")
    reference = train(legacy_python, run, 1)
    losses = train(legacy_python, run, 2)
    assert len(losses) == STEPS
    print(f"PP=2 + ZeRO-1 losses {losses} vs one process {reference}: max rel {rel(losses, reference):.2e}")
    assert rel(losses, reference) <= 1e-5
