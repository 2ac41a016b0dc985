"""NxD's flagship Llama pretraining script (TP + ZeRO-1), vendored unchanged, trained through
``nxd-compat-run`` on gloo ranks at a tiny size; its per-step losses must equal a single-process
run of the same script (fp32, 1e-5 relative).

The script is run as NxD's tutorial runs it (the script, logger.py, training_utils.py,
modeling_llama_nxd.py and lr.py side by side, launched with torchrun); only the model size and
the data (a config.json and a tokenized dataset written here) are ours. Flash attention (on SDPA)
and the fused QKV projection stay at the script's defaults.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from example_run import prepare, rel, step_losses, torchrun

SCRIPT = "tp_zero1_llama_hf_pretrain.py"
TOL = 1e-5
STEPS, SEQ = 4, 32


@pytest.fixture(scope="module")
def workdir(legacy_python, tmp_path_factory):
    return legacy_python, prepare(legacy_python, tmp_path_factory.mktemp("tp_zero1") / "run", "tp_zero1_llama_hf_pretrain")


def train(python: Path, run: Path, name: str, nproc: int, *args: str) -> list[float]:
    """Run the script under torchrun with ``nproc`` ranks; the per-step losses it logged."""
    torchrun(python, run, nproc, SCRIPT, "--model_path", "tiny_llama", "--data_dir", "data", "--output_dir", name,
             "--metrics_file", f"{name}/results.json", "--max_steps", str(STEPS), "--steps_this_run", str(STEPS),
             "--warmup_steps", "1", "--grad_accum_usteps", "1", "--seq_len", str(SEQ), "--use_zero_1",
             "--logging_interval", "1", *args)
    return step_losses(run / name)


@pytest.fixture(scope="module")
def reference(workdir):
    python, run = workdir
    losses = train(python, run, "one_process", 1, "--tensor_parallel_size", "1", "--batch_size", "2")
    assert len(losses) == STEPS
    return losses


@pytest.mark.slow
def test_tp2_sequence_parallel_zero1_matches_one_process(workdir, reference):
    python, run = workdir
    losses = train(python, run, "tp2_sp", 2, "--tensor_parallel_size", "2", "--batch_size", "2",
                   "--sequence_parallel_enabled")
    print(f"TP=2 + SP + ZeRO-1 losses {losses} vs one process {reference}: max rel {rel(losses, reference):.2e}")
    assert rel(losses, reference) <= TOL


@pytest.mark.slow
def test_dp2_zero1_matches_one_process(workdir, reference):
    # Two DP ranks of batch 1 see the rows one process sees in its batch of 2 (DistributedSampler, no shuffle).
    python, run = workdir
    losses = train(python, run, "dp2", 2, "--tensor_parallel_size", "1", "--batch_size", "1")
    print(f"DP=2 + ZeRO-1 losses {losses} vs one process {reference}: max rel {rel(losses, reference):.2e}")
    assert rel(losses, reference) <= TOL
