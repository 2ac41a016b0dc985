"""NxD's Llama fine-tuning example (``lightning/tp_llama_hf_finetune_ptl.py``, vendored unchanged,
with the tutorial's ``module_llama.py`` / ``data_module.py``) through nxd-compat and nxd-lightning,
as its ``tp_zero1_llama2_7b_hf_finetune_ptl.sh`` runs it (``--task open_qa --fuse_qkv 0
--selective_checkpoint_enabled --use_zero_1``) at a tiny size, offline: the databricks-dolly-15k it
downloads and the base model's tokenizer are ``dolly_stand_in.py``'s, the pretrained weights it
loads (``--pretrained_ckpt``, tag ``pretrained_weight``) ``make_pretrained_weight.py``'s.

* TP=2 + sequence parallel + ZeRO-1 gives the per-step losses of one process (fp32, 1e-5 relative:
  TP only reorders the additions of row-parallel partial sums).
* ``--do_eval`` at TP=2 + SP: the model keeps its logits vocab-sharded and the example makes
  generation work through optimum-neuron's patch (``nxd-compat-run``'s stand-in gathers them over
  TP), so both ranks sample from the whole vocabulary with the same random stream. The beam samples
  are the one process's token for token and the ROUGE scores equal: the logits differ from one
  process's by fp32 reordering (~1e-7 relative), which moves a draw across a sampling boundary with
  probability of that order per draw (~4k draws here), and identical texts score identically. Both load one pretrained checkpoint
  and shuffle dolly after loading it, so they see the same packed 2048-token chunks only because
  loading (NxD's ``load_checkpoint``) leaves the random streams alone.
* ``--enable_lora`` (one process; LoRA under TP is nxd-lora's tests'): the pretrained base loads
  under the adapters (step 1, with lora_B = 0, is the full fine-tuning's step-1 loss), only the
  adapters train (the saved norms are the pretrained ones exactly; lora_B moved; step 2 differs
  from full fine-tuning's).
* ``--do_eval``: beam-sampled generation on the held-out rows and torchmetrics' ROUGE,
  the "punkt" sentence splitter it downloads stood in by an empty one (the stand-in words end with " .").
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from example_run import prepare, rel, torchrun

SCRIPT, STEPS = "tp_llama_hf_finetune_ptl.py", 2
HERE = Path(__file__).parent
#: the .sh's flags, at a tiny size (no warmup: step 2 shows step 1's update)
COMMON = ("--model_path", "tiny_llama", "--model_name", "tokenizer", "--data_dir", "dolly", "--task", "open_qa",
          "--batch_size", "1", "--max_steps", str(STEPS), "--steps_this_run", str(STEPS), "--num_train_epochs", "1",
          "--warmup_steps", "0", "--lr", "5e-3", "--grad_accum_usteps", "1", "--selective_checkpoint_enabled",
          "--fuse_qkv", "0", "--use_zero_1", "--pretrained_ckpt", "pretrained")
PUNKT_FILES = ("collocations.tab", "sent_starters.txt", "abbrev_types.txt", "ortho_context.tab")


@pytest.fixture(scope="module")
def run_dir(legacy_python, tmp_path_factory) -> Path:
    run = prepare(legacy_python, tmp_path_factory.mktemp("finetune") / "run", "lightning")
    for helper in ("dolly_stand_in.py", "make_pretrained_weight.py"):
        shutil.copy(HERE / helper, run / helper)
    subprocess.run([str(legacy_python), "dolly_stand_in.py", "dolly", "tokenizer"], cwd=run, check=True,
                   capture_output=True)
    torchrun(legacy_python, run, 1, "make_pretrained_weight.py", "tiny_llama", "pretrained", "--fuse_qkv", "0")
    punkt = run / "nltk_data" / "tokenizers" / "punkt_tab" / "english"
    punkt.mkdir(parents=True)
    for name in PUNKT_FILES:
        (punkt / name).touch()
    return run


def generated(out: str) -> tuple[list[str], str]:
    """The texts the example printed after "=== GENERATED SEQUENCE ===", and its ROUGE score line."""
    texts = re.findall(r"=== GENERATED SEQUENCE ===\n(.*?)\n=== LABEL ===", out, flags=re.S)
    scores = out.split("=== Evaluation Rouge Scores ===\n", 1)[1].splitlines()[0]
    return texts, scores


def train(python: Path, run: Path, tp: int, *extra: str) -> tuple[list[float], str]:
    done = torchrun(python, run, tp, SCRIPT, *COMMON, "--tensor_parallel_size", str(tp), "--log_dir", f"logs{tp}",
                    *extra, env={"NLTK_DATA": str(run / "nltk_data")})
    return [float(x) for x in re.findall(r"step \d+ loss is ([0-9.eE+-]+)", done.stdout)], done.stdout


@pytest.mark.slow
def test_finetune_example_tp2_matches_one_process_in_training_and_eval_and_lora_trains_adapters_only(legacy_python, run_dir):
    reference, out = train(legacy_python, run_dir, 1, "--do_eval")
    assert "=== Evaluation Rouge Scores ===" in out and "Evaluation Finished!" in out
    rouge = re.search(r"'rougeLsum_fmeasure': (?:np\.float64\()?([0-9.]+)", out)
    assert rouge and 0.0 <= float(rouge.group(1)) <= 1.0

    losses, out_tp2 = train(legacy_python, run_dir, 2, "--sequence_parallel_enabled", "--do_eval")
    assert len(reference) == STEPS and len(losses) == STEPS
    print(f"fine-tuning TP=2 + SP + ZeRO-1 losses {losses} vs one process {reference}: max rel {rel(losses, reference):.2e}")
    assert rel(losses, reference) <= 1e-5
    texts, scores = generated(out)
    texts_tp2, scores_tp2 = generated(out_tp2)
    assert len(texts) == 8 and texts_tp2 == texts  # the held-out rows' beam samples, token for token
    assert scores_tp2 == scores, (scores_tp2, scores)

    lora, _ = train(legacy_python, run_dir, 1, "--enable_lora")
    assert len(lora) == STEPS
    assert rel(lora[:1], reference[:1]) <= 1e-5  # lora_B starts at 0: the pretrained model's loss
    assert abs(lora[1] - reference[1]) > 1e-4 * reference[1]  # adapters only: another update than full fine-tuning
    pretrained = torch.load(run_dir / "pretrained" / "pretrained_weight" / "model" / "dp_rank_00_tp_rank_00_pp_rank_00.pt")
    # the example's nxd.save_checkpoint(checkpoint_dir_str="lora_adapter", tag="lora", model=<its LightningModule>)
    saved = torch.load(run_dir / "lora_adapter" / "lora" / "model" / "dp_rank_00_tp_rank_00_pp_rank_00.pt")
    for name, tensor in pretrained.items():  # frozen: exactly the pretrained weights
        assert torch.equal(saved[f"model.module.{name}"], tensor), name
    lora_b = [v for k, v in saved.items() if k.endswith("lora_B")]
    assert len(lora_b) == 6 and all(b.abs().max() > 0 for b in lora_b)
