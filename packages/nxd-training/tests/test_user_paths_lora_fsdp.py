"""A new user's fine-tuning journey through ``nxd train`` and ``nxd ckpt``, on 2 gloo ranks: Hugging
Face weights (``model.pretrained_checkpoint``) -> LoRA SFT on FSDP -> checkpoint -> Ctrl-C ->
resume -> the adapter in PEFT's format (written next to each checkpoint, and by ``nxd ckpt convert
--lora adapter``) and the merged model. Oracles: the resumed run's losses and gradient norms equal
the interrupted run's bit for bit at the steps both ran; PEFT on transformers' Llama gives nxd's
logits (the checkpoint rebuilt in one process) within 1e-5."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from nxd.cli import main

CODE = "import sys; from nxd.cli import main; sys.exit(main())"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PEFT = {"lora_rank": 4, "lora_alpha": 8, "lora_dropout": 0.0, "save_lora_base": True, "target_modules": TARGETS}
PROBE = torch.tensor([[5, 17, 99, 3, 250, 42, 7, 311, 64, 128, 2, 19]])
#: the first run's ranks stop before this step (then Ctrl-C); checkpoints every CKPT_EVERY steps
PAUSE_AFTER, CKPT_EVERY = 7, 4

#: in the ranks of the first run only: wait (for the Ctrl-C) once PAUSE_AFTER steps are done, so the
#: interrupt lands at the same step on any machine
PAUSE_HOOK = """
import os
if os.environ.get("TORCHELASTIC_RUN_ID") and os.environ.get("NXD_TEST_PAUSE_AFTER"):
    import time
    from nxd_training.loop import Trainer

    _train_step = Trainer.train_step

    def _paused(self, it):
        while self.step >= int(os.environ["NXD_TEST_PAUSE_AFTER"]):
            time.sleep(1)
        return _train_step(self, it)

    Trainer.train_step = _paused
"""


@pytest.fixture(scope="module")
def hf_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    out = tmp_path_factory.mktemp("hf") / "tiny-llama"
    config = LlamaConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    LlamaForCausalLM(config).save_pretrained(out)
    return out


def _sft_file(tmp_path: Path) -> Path:
    path = tmp_path / "train.jsonl"
    words = ["king", "love", "night", "sword", "crown", "heart", "storm", "blood"]
    path.write_text("".join(json.dumps({"prompt": f"Say {w} twice:", "completion": f" {w} {w}"}) + "\n"
                            for w in words * 12))
    return path


def _nxd(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    # its own session, like a shell's job: killpg below is the terminal's Ctrl-C
    return subprocess.Popen([sys.executable, "-c", CODE, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
                            start_new_session=True)


def _train_records(run: Path) -> dict[int, dict]:
    path = run / "metrics.jsonl"
    records = map(json.loads, path.read_text().splitlines()) if path.exists() else []
    return {r["step"]: r for r in records if r.get("split") == "train"}


def _hf_logits(base: Path, adapter: Path | None = None) -> torch.Tensor:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter))
    with torch.no_grad():
        return model.eval()(PROBE).logits


def _nxd_logits(hf_dir: Path, ckpt_dir: Path, tag: str) -> torch.Tensor:
    """nxd's own model on the checkpoint, rebuilt in this process: the Llama of the HF folder's
    config, LoRA adapters as trained, every tensor from the checkpoint."""
    import nxd
    from nxd_ckpt.consolidate import full_model_state
    from nxd_ckpt.convert import single_rank
    from nxd_lora import LoraConfig

    spec = nxd.get_model("llama")
    lora = LoraConfig(enable_lora=True, lora_rank=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS)
    with single_rank() as context:
        base = nxd.build_parallel_model(spec, json.loads((hf_dir / "config.json").read_text()), context=context)
        model = nxd.get_component("adapter", "lora")(base, lora)
        model.load_state_dict(full_model_state(str(ckpt_dir), tag), strict=True)
        with torch.no_grad():
            return model.eval()(input_ids=PROBE).logits.float()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def test_hf_lora_sft_on_fsdp_ctrl_c_resume_export_peft(hf_llama: Path, make_config, tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    config = make_config(
        trainer={"max_steps": 100},
        distributed_strategy={"tensor_model_parallel_size": 1, "fsdp": True},
        data={"module": None, "data_prefix": None, "splits_string": None, "train_dir": str(_sft_file(tmp_path))},
        model={"pretrained_checkpoint": str(hf_llama), "optim": {"lr": 5e-2}},
        model_alignment_strategy={"sft": {"packing": True}, "peft": PEFT},
        exp_manager={"explicit_log_dir": str(run), "resume_if_exists": True,
                     "checkpoint_callback_params": {"every_n_train_steps": CKPT_EVERY, "save_top_k": -1}})
    config["data"] = {k: v for k, v in config["data"].items() if v is not None}  # SFT: no pretraining keys
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(config))
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(PAUSE_HOOK)
    pythonpath = os.pathsep.join(p for p in (str(hooks), os.environ.get("PYTHONPATH")) if p)

    # 1. train from the HF weights; Ctrl-C once the ranks wait after step PAUSE_AFTER
    job = _nxd(["train", str(path)], {"PYTHONPATH": pythonpath, "NXD_TEST_PAUSE_AFTER": str(PAUSE_AFTER)})
    try:
        deadline = time.monotonic() + 300
        while PAUSE_AFTER - 1 not in _train_records(run):  # a step's record is written during the next one
            assert job.poll() is None, job.stdout.read()
            assert time.monotonic() < deadline, "training did not reach the pause in time"
            time.sleep(0.2)
        os.killpg(job.pid, signal.SIGINT)
        out, _ = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == 130, out
    assert f"nxd train: initialised from HF weights {hf_llama}" in out, out
    assert f"last complete checkpoint: step {CKPT_EVERY} " in out and "Traceback" not in out, out
    before = _train_records(run)

    # 2. the printed command resumes; it runs on to the next checkpoint
    resumed = _nxd(["train", str(run / "config.yaml"), f"trainer.max_steps={2 * CKPT_EVERY}"])
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out
    assert "resumed from" in out, out
    after = _train_records(run)
    assert sorted(after) == list(range(1, 2 * CKPT_EVERY + 1)), sorted(after)
    # the steps the interrupted run took after its checkpoint, taken again: bit for bit
    again = [s for s in before if s > CKPT_EVERY]
    assert len(again) >= 2, sorted(before)
    for step in again:
        assert (after[step]["loss"], after[step]["grad_norm"]) == (before[step]["loss"], before[step]["grad_norm"]), step
    losses = [after[s]["loss"] for s in sorted(after)]
    print(f"LoRA SFT on FSDP from HF weights: loss {losses[0]:.4f} -> {losses[-1]:.4f}; resumed steps {again} "
          "bit-identical (loss, grad norm)")
    assert losses[-1] < losses[0]

    # 3. evaluate: nxd eval takes the newest checkpoint with its adapters (not the HF folder the run started from)
    ckpts = run / "checkpoints"
    tag = f"tiny--step={2 * CKPT_EVERY}-consumed_samples={2 * CKPT_EVERY * 4}"
    capsys.readouterr()
    # the SFT run had no validation split: evaluated on its records, as a user points eval at held-out data
    assert main(["eval", str(run), f"data.val_dir={tmp_path / 'train.jsonl'}", "trainer.limit_val_batches=2"]) == 0
    said = capsys.readouterr().out
    assert f"nxd eval: weights from checkpoint {ckpts / tag} (step {2 * CKPT_EVERY}, written at TP 1 x PP 1 x DP 2, " \
           "LoRA adapters included)" in said, said
    assert math.isfinite(float(said.split("validation loss ")[1].split()[0])), said

    # 4. the adapter leaves in PEFT's format; PEFT on transformers gives nxd's logits
    assert (ckpts / tag / "lora_adapter" / "adapter_config.json").is_file(), sorted(p.name for p in ckpts.iterdir())
    assert main(["ckpt", "convert", "--from", "nxd", "--to", "hf", str(run), "--lora", "adapter",
                 "--output", str(tmp_path / "adapter")]) == 0
    assert main(["ckpt", "convert", "--from", "nxd", "--to", "hf", str(run), "--lora", "merge",
                 "--output", str(tmp_path / "merged")]) == 0
    # the adapter written next to the checkpoint by the FSDP run equals the converted one exactly
    live, converted = (load_file(d / "adapter_model.safetensors")
                       for d in (ckpts / tag / "lora_adapter", tmp_path / "adapter" / "lora_adapter"))
    assert sorted(live) == sorted(converted) and all(torch.equal(live[k], converted[k]) for k in live)
    ours = _nxd_logits(hf_llama, ckpts, tag)
    errors = {"PEFT (checkpoint's adapter)": _rel(_hf_logits(ckpts / tag / "base_model", ckpts / tag / "lora_adapter"), ours),
              "PEFT (nxd ckpt convert --lora adapter)": _rel(
                  _hf_logits(tmp_path / "adapter", tmp_path / "adapter" / "lora_adapter"), ours),
              "merged (nxd ckpt convert --lora merge)": _rel(_hf_logits(tmp_path / "merged"), ours)}
    print("vs nxd's logits: " + ", ".join(f"{k} {v:.1e}" for k, v in errors.items()))
    assert max(errors.values()) < 1e-5, errors
    assert _rel(_hf_logits(hf_llama), ours) > 1e-3  # the adapter was trained: it changes the model
