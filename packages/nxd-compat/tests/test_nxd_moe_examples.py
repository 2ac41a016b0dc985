"""NxD's MoE pretraining examples, Mixtral (``mixtral_pretrain/run_mixtral_pretrain_ptl.py`` with its
``module_mixtral.py`` and ``data_module.py`` and the shared ``modeling_mixtral_moe_nxd.py``,
``training_utils.py``, ``lr.py``) and DBRX (the same files of ``dbrx/``), vendored unchanged, in the
environment their requirements.txt pin (transformers 4.48, Lightning), through ``nxd-compat-run``:
the models' MoE layers are built with NxD's MoE API (``RouterTopK``, ``ExpertMLPs``, ``MoE``; DBRX
also zeroes padded expert columns through ``expert_mlps.mlp_op``, and its router has NxD's
``jitter_eps``) and trained by nxd-lightning.

A tiny ``config.json`` per model (given by ``--model_path``, as the scripts' .sh do with their
configs) and a tokenized dataset are ours. ``--use_zero_1`` as the .sh sets it (NxD's mixed-precision config needs
it). TP=2 against the same script in one process: per-step losses within 1e-5 relative (fp32; the
example's init is NxD's master-weight init, which is the same model at every TP degree); EP=2
(``--expert_parallel_size 2``) against the same 2 data-parallel ranks without EP; PP=2
(``--pipeline_parallel_size 2``: the scripts' PP Lightning module and pipeline config, router
logits carried between the stages) against one process.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from example_run import MAKE_DATA, rel, torchrun

EXAMPLES = Path(__file__).parent / "nxd_examples"
STEPS = 3
TINY_MIXTRAL = """{"architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
 "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 128,
 "max_position_embeddings": 64, "model_type": "mixtral", "num_attention_heads": 4, "num_experts_per_tok": 2,
 "num_hidden_layers": 2, "moe_frequency": 1, "num_key_value_heads": 4, "num_local_experts": 4,
 "output_router_logits": true, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
 "sliding_window": null, "tie_word_embeddings": false, "use_cache": false, "vocab_size": 128, "pretraining_tp": 1,
 "use_flash_attention": false}"""
TINY_DBRX = """{"architectures": ["DbrxForCausalLM"], "attn_config": {"clip_qkv": 8, "kv_n_heads": 4, "model_type": "",
 "rope_theta": 500000}, "d_model": 64, "emb_pdrop": 0.0, "ffn_config": {"ffn_hidden_size": 128, "model_type": "",
 "moe_jitter_eps": 0.01, "moe_loss_weight": 0.05, "moe_num_experts": 4, "moe_top_k": 2, "ffn_act_fn": {"name": "silu"}},
 "initializer_range": 0.02, "max_seq_len": 64, "model_type": "dbrx", "n_heads": 4, "n_layers": 2,
 "output_router_logits": true, "resid_pdrop": 0.0, "tie_word_embeddings": false, "torch_dtype": "float32",
 "use_cache": false, "vocab_size": 128, "pretraining_tp": 1, "move_model_to_device": false}"""
#: example directory -> (script, its tiny config)
MOE_EXAMPLES = {"mixtral": ("run_mixtral_pretrain_ptl.py", TINY_MIXTRAL), "dbrx": ("run_dbrx_pretrain_ptl.py", TINY_DBRX)}
COMMON = ("--model_path", "tiny_model", "--data_dir", "data", "--batch_size", "2", "--max_steps", str(STEPS),
          "--steps_this_run", str(STEPS), "--warmup_steps", "1", "--lr", "1e-3", "--seq_len", "32", "--use_zero_1")


def prepare(python: Path, run: Path, example: str, jitter: bool = True) -> str:
    """``run`` holding the example's scripts side by side (as its .sh runs them), its tiny config
    (DBRX's router jitter off with ``jitter=False``) and data; returns the script to run."""
    script, config = MOE_EXAMPLES[example]
    if not jitter:
        config = config.replace('"moe_jitter_eps": 0.01', '"moe_jitter_eps": 0.0')
    run.mkdir(parents=True)
    for path in [*(EXAMPLES / example).glob("*.py"), *(EXAMPLES / example / f"{example}_pretrain").glob("*.py")]:
        shutil.copy(path, run / path.name)
    (run / "tiny_model").mkdir()
    (run / "tiny_model" / "config.json").write_text(config)
    subprocess.run([str(python), "-c", MAKE_DATA, str(run / "data")], check=True, capture_output=True)
    return script


def train(python: Path, run: Path, script: str, tp: int, nproc: int | None = None, ep: int = 1,
          *extra: str) -> list[float]:
    done = torchrun(python, run, nproc or tp, script, *COMMON, "--tensor_parallel_size", str(tp),
                    "--expert_parallel_size", str(ep), *extra,
                    "--log_dir", f"logs_tp{tp}_ep{ep}_n{nproc or tp}{''.join(extra).replace('-', '')}")
    return [float(x) for x in re.findall(r"step \d+ loss is ([0-9.eE+-]+)", done.stdout)]


#: example -> its per-step losses in one process (batch 2), shared by the tests that compare to it
_ONE_PROCESS: dict[str, list[float]] = {}


def one_process(python: Path, run: Path, script: str, example: str) -> list[float]:
    if example not in _ONE_PROCESS:
        _ONE_PROCESS[example] = train(python, run, script, 1)
    return _ONE_PROCESS[example]


@pytest.mark.slow
@pytest.mark.parametrize("example", sorted(MOE_EXAMPLES))
def test_moe_example_tp2_matches_one_process(legacy_python, tmp_path, example):
    script = prepare(legacy_python, tmp_path / "run", example)
    reference = one_process(legacy_python, tmp_path / "run", script, example)
    losses = train(legacy_python, tmp_path / "run", script, 2)
    assert len(reference) == STEPS and len(losses) == STEPS
    print(f"\n{example} example TP=2 + ZeRO-1 losses {losses} vs one process {reference}: "
          f"max rel {rel(losses, reference):.2e}")
    assert rel(losses, reference) <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("example", sorted(MOE_EXAMPLES))
def test_moe_example_expert_parallel_matches_data_parallel(legacy_python, tmp_path, example):
    """``--expert_parallel_size 2`` (the scripts' flag) on 2 data-parallel ranks against the same 2
    ranks without EP: each rank routes its own tokens either way (the router loss is per rank in
    both), and EP moves them to the experts' ranks and back; the model is the same at both degrees
    (nxd draws every expert, unlike NxD). The same products summed in another order: within 1e-5."""
    script = prepare(legacy_python, tmp_path / "run", example)
    reference = train(legacy_python, tmp_path / "run", script, 1, nproc=2)
    losses = train(legacy_python, tmp_path / "run", script, 1, nproc=2, ep=2)
    assert len(reference) == STEPS and len(losses) == STEPS
    print(f"\n{example} example DP=2 EP=2 losses {losses} vs EP=1 {reference}: max rel {rel(losses, reference):.2e}")
    assert rel(losses, reference) <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("example", sorted(MOE_EXAMPLES))
def test_moe_example_pipeline_matches_one_process(legacy_python, tmp_path, example):
    """``--pipeline_parallel_size 2``: the examples' models thread the router logits through their
    layers (``past_router_logits``); nxd-pipeline carries them from stage 0 to stage 1 with the
    hidden state and the last stage adds the load-balancing loss over both layers' (NxD's traced
    pipeline sends them the same way). Mixtral with 1 micro-batch against the one-process run of
    the whole batch; DBRX with 2 micro-batches against one process accumulating the same two
    (``--batch_size 1 --grad_accum_usteps 2``: each micro-batch's aux loss is its own), its router
    jitter off (each stage draws its noise on its own rank). Within 1e-5 (measured: equal)."""
    if example == "mixtral":
        script = prepare(legacy_python, tmp_path / "run", example)
        reference = one_process(legacy_python, tmp_path / "run", script, example)
        microbatches = "1"
    else:
        script = prepare(legacy_python, tmp_path / "run", example, jitter=False)
        reference = train(legacy_python, tmp_path / "run", script, 1, 1, 1, "--batch_size", "1",
                          "--grad_accum_usteps", "2")
        microbatches = "2"
    losses = train(legacy_python, tmp_path / "run", script, 1, 2, 1, "--pipeline_parallel_size", "2",
                   "--num_microbatches", microbatches)
    assert len(reference) == STEPS and len(losses) == STEPS
    print(f"\n{example} example PP=2 x {microbatches} micro-batch(es) + ZeRO-1 losses {losses} vs one process "
          f"{reference}: max rel {rel(losses, reference):.2e}")
    assert rel(losses, reference) <= 1e-5
