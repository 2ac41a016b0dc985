"""NxD's PyTorch Lightning tutorial (``lightning/run_llama_nxd_ptl.py`` with its
``module_llama.py`` and ``data_module.py``, vendored unchanged) through nxd-compat and
nxd-lightning on two gloo ranks: TP=2 with the tutorial's default sequence parallelism and ZeRO-1,
against the same script in one process (fp32; per-step losses within 1e-5 relative).

The tutorial's model (``NeuronLlamaLTModule``), data module, ``NeuronXLAStrategy``,
``NeuronXLAPrecisionPlugin``, ``NeuronTQDMProgressBar`` and ``NeuronTensorBoardLogger`` are used
as the script builds them; the losses are the ones its module prints (``step N loss is X``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from example_run import prepare, rel, torchrun

pytestmark = pytest.mark.launch  # every test here trains through a launch

SCRIPT, STEPS = "run_llama_nxd_ptl.py", 3
COMMON = ("--model_path", "tiny_llama", "--data_dir", "data", "--train_batch_size", "2", "--max_steps", str(STEPS),
          "--steps_this_run", str(STEPS), "--seq_len", "32", "--scheduler_type", "linear", "--warmup_steps", "1",
          "--use_zero1_optimizer", "1")


def train(python: Path, run: Path, tp: int) -> list[float]:
    done = torchrun(python, run, tp, SCRIPT, *COMMON, "--tensor_parallel_size", str(tp), "--tb_dir", f"tp{tp}")
    return [float(x) for x in re.findall(r"step \d+ loss is ([0-9.eE+-]+)", done.stdout)]


@pytest.mark.slow
def test_lightning_tutorial_tp2_sp_zero1_matches_one_process(legacy_python, tmp_path):
    run = prepare(legacy_python, tmp_path / "run", "lightning")
    reference = train(legacy_python, run, 1)
    losses = train(legacy_python, run, 2)
    assert len(reference) == STEPS and len(losses) == STEPS
    print(f"Lightning TP=2 + SP + ZeRO-1 losses {losses} vs one process {reference}: max rel {rel(losses, reference):.2e}")
    assert rel(losses, reference) <= 1e-5
