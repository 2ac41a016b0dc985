"""NxD's flagship Llama pretraining script (TP + ZeRO-1), vendored unchanged, trained through
``nxd-compat-run`` on gloo ranks at a tiny size; its per-step losses must equal a single-process
run of the same script (fp32, 1e-5 relative).

The script is run as NxD's tutorial runs it (the script, logger.py, training_utils.py,
modeling_llama_nxd.py and lr.py side by side, launched with torchrun); only the model size and
the data (a config.json and a tokenized dataset written here) are ours. Flash attention (on SDPA)
and the fused QKV projection stay at the script's defaults.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from legacy_env import build

EXAMPLES = Path(__file__).parent / "nxd_examples" / "llama"
SCRIPT = "tp_zero1_llama_hf_pretrain.py"
TOL = 1e-5
STEPS, SEQ, ROWS = 4, 32, 32

TINY_LLAMA = """{"architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
 "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 128, "max_position_embeddings": 64,
 "model_type": "llama", "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 4,
 "pad_token_id": 0, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0,
 "tie_word_embeddings": false, "torch_dtype": "float32", "use_cache": true, "vocab_size": 128,
 "sequence_parallel_enabled": false, "selective_checkpoint_enabled": false}"""

MAKE_DATA = f"""
import sys, datasets, torch
ids = torch.randint(3, 128, ({ROWS}, {SEQ}), generator=torch.Generator().manual_seed(0)).tolist()
datasets.Dataset.from_dict({{"input_ids": ids, "attention_mask": [[1] * {SEQ}] * {ROWS}, "labels": ids}}).save_to_disk(sys.argv[1])
"""


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("nxd_example")
    python = build(root)
    run = root / "run"
    run.mkdir()
    for path in [*EXAMPLES.glob("tp_zero1_llama_hf_pretrain/*.py"), *(EXAMPLES / n for n in
                 ("training_utils.py", "modeling_llama_nxd.py", "lr.py"))]:
        shutil.copy(path, run / path.name)
    (run / "tiny_llama").mkdir()
    (run / "tiny_llama" / "config.json").write_text(TINY_LLAMA)
    subprocess.run([str(python), "-c", MAKE_DATA, str(run / "data")], check=True, capture_output=True)
    return python, run


def train(python: Path, run: Path, name: str, nproc: int, *args: str) -> list[float]:
    """Run the script under torchrun with ``nproc`` ranks; the per-step losses it logged."""
    env = dict(os.environ, NXD_COMPAT_QUIET="1", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               # the example's logger asks an EC2 metadata endpoint for the instance type: refuse fast
               http_proxy="http://127.0.0.1:9", https_proxy="http://127.0.0.1:9", no_proxy="", NO_PROXY="")
    command = [str(python), "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", "nxd_compat.run", SCRIPT, "--model_path", "tiny_llama", "--data_dir", "data",
               "--output_dir", name, "--metrics_file", f"{name}/results.json", "--max_steps", str(STEPS),
               "--steps_this_run", str(STEPS), "--warmup_steps", "1", "--grad_accum_usteps", "1",
               "--seq_len", str(SEQ), "--use_zero_1", "--logging_interval", "1", *args]
    done = subprocess.run(command, cwd=run, env=env, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, f"{' '.join(command)}\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (logdir,) = (run / name).glob("neuron_tblogs_*")
    events = EventAccumulator(str(logdir))
    events.Reload()
    return [e.value for e in events.Scalars("step loss")]


@pytest.fixture(scope="module")
def reference(workdir):
    python, run = workdir
    losses = train(python, run, "one_process", 1, "--tensor_parallel_size", "1", "--batch_size", "2")
    assert len(losses) == STEPS
    return losses


def rel(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))


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
