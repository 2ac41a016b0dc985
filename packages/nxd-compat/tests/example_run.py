"""Running NxD's vendored example scripts the way their tutorials do: side by side with their
helper modules, under torchrun through ``nxd_compat.run``, at a tiny size (a config.json and a
tokenized dataset written here); the per-step losses come from the examples' TensorBoard logs."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

EXAMPLES = Path(__file__).parent / "nxd_examples" / "llama"
SHARED = ("training_utils.py", "modeling_llama_nxd.py", "lr.py")
SEQ, ROWS = 32, 32

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

ENV = dict(NXD_COMPAT_QUIET="1", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
           # the examples' logger asks an EC2 metadata endpoint for the instance type: refuse fast
           http_proxy="http://127.0.0.1:9", https_proxy="http://127.0.0.1:9", no_proxy="", NO_PROXY="")


def prepare(python: Path, run: Path, example: str) -> Path:
    """``run`` holding the example directory's scripts, the shared modules, tiny_llama/ and data/."""
    run.mkdir(parents=True)
    for path in [*(EXAMPLES / example).glob("*.py"), *(EXAMPLES / n for n in SHARED)]:
        shutil.copy(path, run / path.name)
    (run / "tiny_llama").mkdir()
    (run / "tiny_llama" / "config.json").write_text(TINY_LLAMA)
    subprocess.run([str(python), "-c", MAKE_DATA, str(run / "data")], check=True, capture_output=True)
    return run


def torchrun(python: Path, run: Path, nproc: int, script: str, *args: str,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    command = [str(python), "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", "nxd_compat.run", script, *args]
    done = subprocess.run(command, cwd=run, env=dict(os.environ, **ENV, **(env or {})), capture_output=True, text=True,
                          timeout=540)
    assert done.returncode == 0, f"{' '.join(command)}\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
    return done


def step_losses(logdir_parent: Path, tag: str = "step loss") -> list[float]:
    """The ``tag`` scalars ("step loss", or "grad-norm" with ``--print_grad_norm``) of the example's
    TensorBoard log under ``logdir_parent``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (logdir,) = logdir_parent.glob("neuron_tblogs_*")
    events = EventAccumulator(str(logdir))
    events.Reload()
    return [e.value for e in events.Scalars(tag)]


def rel(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))
