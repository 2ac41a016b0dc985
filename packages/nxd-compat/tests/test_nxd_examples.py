"""NxD's flagship Llama pretraining script (TP + ZeRO-1), vendored unchanged, trained through
``nxd-compat-run`` on gloo ranks at a tiny size; its per-step losses must equal a single-process
run of the same script (fp32, 1e-5 relative).

The script is run as NxD's tutorial runs it (the script, logger.py, training_utils.py,
modeling_llama_nxd.py and lr.py side by side, launched with torchrun); only the model size and
the data (a config.json and a tokenized dataset written here) are ours. Flash attention (on SDPA)
and the fused QKV projection stay at the script's defaults.

Context parallelism (CP=2) minimises what NxD's CP minimises: the mean over CP ranks of each rank's
mean token loss, after ``get_batch_on_this_context_parallel_rank`` shifted the labels (the last
position gets -100) and split the sequence in two. That is one process's mean only when both halves
hold as many labelled tokens, so the data masks one label of each row's first half (``labels[1]``,
as a prompt token would be): then the gradient of every step is one process's. The script logs
the step loss before it is averaged over CP (it all-reduces ``running_loss`` before adding the
step's loss), i.e. CP rank 0's half, so the CP run's oracle is the gradient it logs
(``--print_grad_norm``: the global norm of the reduced gradient, each step after the previous
updates) against one process's, fp32, 1e-5 relative.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from example_run import prepare, rel, step_losses, torchrun

SCRIPT = "tp_zero1_llama_hf_pretrain.py"
TOL = 1e-5
STEPS, SEQ = 4, 32


#: one label of each row's first half masked, so both CP=2 halves hold 15 labelled tokens (see above)
MASK_ONE_LABEL = """
import sys, datasets
rows = datasets.load_from_disk(sys.argv[1])
rows.map(lambda row: {"labels": [row["labels"][0], -100, *row["labels"][2:]]}).save_to_disk(sys.argv[2])
"""


@pytest.fixture(scope="module")
def workdir(legacy_python, tmp_path_factory):
    run = prepare(legacy_python, tmp_path_factory.mktemp("tp_zero1") / "run", "tp_zero1_llama_hf_pretrain")
    subprocess.run([str(legacy_python), "-c", MASK_ONE_LABEL, "data", "data_masked"], cwd=run, check=True,
                   capture_output=True)
    return legacy_python, run


def train_logs(python: Path, run: Path, name: str, nproc: int, *args: str) -> tuple[list[float], list[float]]:
    """Run the script under torchrun with ``nproc`` ranks; the per-step losses and gradient norms it logged."""
    torchrun(python, run, nproc, SCRIPT, "--model_path", "tiny_llama", "--data_dir", "data_masked", "--output_dir",
             name, "--metrics_file", f"{name}/results.json", "--max_steps", str(STEPS), "--steps_this_run",
             str(STEPS), "--warmup_steps", "1", "--grad_accum_usteps", "1", "--seq_len", str(SEQ), "--use_zero_1",
             "--logging_interval", "1", "--print_grad_norm", *args)
    return step_losses(run / name), step_losses(run / name, "grad-norm")


def train(python: Path, run: Path, name: str, nproc: int, *args: str) -> list[float]:
    return train_logs(python, run, name, nproc, *args)[0]


@pytest.fixture(scope="module")
def reference_logs(workdir):
    python, run = workdir
    losses, norms = train_logs(python, run, "one_process", 1, "--tensor_parallel_size", "1", "--batch_size", "2")
    assert len(losses) == STEPS and len(norms) == STEPS
    return losses, norms


@pytest.fixture(scope="module")
def reference(reference_logs):
    return reference_logs[0]


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


@pytest.mark.slow
def test_cp2_zero1_gradients_match_one_process(workdir, reference_logs):
    # the model refuses CP with flash attention ("Please set `use_flash_attention` to False"): ring attention
    python, run = workdir
    losses, norms = train_logs(python, run, "cp2", 2, "--tensor_parallel_size", "1", "--context_parallel_size", "2",
                               "--batch_size", "2", "--use_flash_attention", "0")
    print(f"CP=2 + ZeRO-1 grad norms {norms} vs one process {reference_logs[1]}: max rel {rel(norms, reference_logs[1]):.2e}")
    assert len(losses) == STEPS and rel(norms, reference_logs[1]) <= TOL
