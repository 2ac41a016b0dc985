"""NxD's BERT pretraining example (``tp_dp_bert_large_hf_pretrain_hdf5.py``, vendored unchanged) in
the environment its requirements.txt pins (transformers 4.26, h5py), through ``nxd-compat-run``.

The script loads ``bert-large-uncased`` from the Hugging Face hub and reads ``*_training_*.hdf5``
shards; the test puts a tiny BERT under that name in an offline HF cache and writes two tiny HDF5
shards with the keys the script reads (the model size, its dropout set to 0 so that runs are
deterministic, and the data are the only things that are ours).

Loss parity: the example draws its parallel attention weights on each rank (``normal_`` on the
local shard, std scaled by 1/sqrt(TP)), so a TP=2 run starts from another model than TP=1. What its
math does allow: the run trains one step at TP=2 and saves (``checkpointing.save``, NxD's layout,
with the optimizer), resumes (``--resume_ckpt``: ``checkpointing.load`` + ``optimizer.load_state_dict``)
and logs step 2's loss on the first batch; transformers' ``BertForPreTraining`` holding that
checkpoint's shards put together gives the same loss in one process (``bert_reference.py``), within
1e-5 relative (fp32; TP only reorders the row-parallel layer's additions).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from example_run import rel, torchrun

EXAMPLE = Path(__file__).parent / "nxd_examples" / "tp_dp_bert_hf_pretrain"
SCRIPT = "tp_dp_bert_large_hf_pretrain_hdf5.py"
SNAPSHOT = "0" * 40
BATCH, MAX_PRED, SEQ, ROWS = 2, 5, 32, 8
PARITY = 1e-5
TINY_BERT = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                 max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
MAKE_MODEL = """
import json, sys, torch
from transformers import BertConfig, BertForPreTraining
torch.manual_seed(0)
BertForPreTraining(BertConfig(**json.loads(sys.argv[2]))).save_pretrained(sys.argv[1])
"""
MAKE_DATA = f"""
import sys, h5py, numpy as np
rng = np.random.default_rng(0)
for shard in range(2):  # the script trains on every shard file after the first it preloads: two at least
    positions = np.sort(rng.choice(np.arange(1, {SEQ}), size=({ROWS}, {MAX_PRED}), replace=True), axis=1)
    positions[:, -1] = 0  # a padded slot, as NVIDIA's BERT data has when fewer tokens are masked
    with h5py.File(f"{{sys.argv[1]}}/wiki_training_{{shard}}.hdf5", "w") as f:
        f["input_ids"] = rng.integers(3, 128, size=({ROWS}, {SEQ}))
        f["input_mask"] = np.ones(({ROWS}, {SEQ}), dtype=np.int64)
        f["segment_ids"] = np.repeat([[0] * ({SEQ} // 2) + [1] * ({SEQ} // 2)], {ROWS}, axis=0)
        f["masked_lm_positions"] = positions
        f["masked_lm_ids"] = rng.integers(3, 128, size=({ROWS}, {MAX_PRED}))
        f["next_sentence_labels"] = rng.integers(0, 2, size=({ROWS},))
"""


@pytest.fixture(scope="module")
def workdir(bert_python, tmp_path_factory):
    run = tmp_path_factory.mktemp("bert") / "run"
    run.mkdir()
    for path in (EXAMPLE / SCRIPT, Path(__file__).parent / "bert_reference.py"):
        shutil.copy(path, run / path.name)
    repo = run / "hf" / "hub" / "models--bert-large-uncased"
    snapshot = repo / "snapshots" / SNAPSHOT
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(SNAPSHOT)
    (run / "data").mkdir()
    for make, arg in ((MAKE_MODEL, str(snapshot)), (MAKE_DATA, str(run / "data"))):
        subprocess.run([str(bert_python), "-c", make, arg, json.dumps(TINY_BERT)], check=True, capture_output=True)
    return bert_python, run


def train(python: Path, run: Path, tp: int, steps: int, *extra: str) -> dict[int, float]:
    torchrun(python, run, tp, SCRIPT, "--data_dir", "data", "--output_dir", "out", "--metrics_file", "out/results.json",
             "--batch_size", str(BATCH), "--max_pred_len", str(MAX_PRED), "--max_steps", "4", "--steps_this_run",
             str(steps), "--lr", "1e-3", "--warmup_steps", "1", "--grad_accum_usteps", "1", "--tensor_parallel_size",
             str(tp), *extra, env={"HF_HOME": str(run / "hf")})
    return step_losses(run / "out")


def step_losses(out: Path) -> dict[int, float]:
    """Every "step loss" the runs into ``out`` logged, by step (a later run's value wins)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    losses: dict[int, tuple[float, float]] = {}
    for logdir in out.glob("neuron_tblogs_*"):
        events = EventAccumulator(str(logdir))
        events.Reload()
        for e in events.Scalars("step loss"):
            if e.step not in losses or e.wall_time > losses[e.step][0]:
                losses[e.step] = (e.wall_time, e.value)
    return {step: value for step, (_, value) in losses.items()}


@pytest.mark.slow
def test_bert_example_at_tp2_resumes_with_the_loss_of_one_process(workdir):
    python, run = workdir
    assert set(train(python, run, 2, 1)) == {1}
    assert sorted(p.name for p in (run / "out").glob("tp_rank_*")) == ["tp_rank_00_pp_rank_00", "tp_rank_01_pp_rank_00"]
    done = torchrun(python, run, 1, "bert_reference.py", "out", f"hf/hub/models--bert-large-uncased/snapshots/{SNAPSHOT}",
                    "data", str(BATCH), str(MAX_PRED), "2", env={"HF_HOME": str(run / "hf")})
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("REFERENCE_LOSS")]
    reference = json.loads(line.split(maxsplit=1)[1])
    resumed = train(python, run, 2, 2, "--resume_ckpt")[2]  # step 2: the first batch again, after the saved step
    assert rel([resumed], [reference]) < PARITY, (resumed, reference)
    print(f"\nBERT example step-2 loss after resume at TP=2: {resumed}, one process (transformers): {reference}")
