"""QLoRA through ``nxd train`` on FSDP=2 gloo ranks, one journey: Hugging Face weights -> NF4 base
(quantised as the model is built, sharded by FSDP with its scales) + fp32 adapters -> checkpoints
without the frozen base -> resume from the first checkpoint (the base quantised again from the HF
folder) -> ``nxd eval`` of the last checkpoint -> ``nxd ckpt convert --lora adapter`` -> PEFT on the dequantised base. Oracles: the resumed
steps' loss and gradient norm equal the first run's bit for bit; PEFT's logits equal nxd's (the
checkpoint rebuilt in one process) within 1e-5. FSDP's numerics against one process are
nxd-fsdp's tests/test_qlora_fsdp.py; the NF4 forward against a dequantised reference nxd-lora's."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from nxd.cli import main

pytest.importorskip("torchao.quantization.quantize_.workflows.nf4.nf4_tensor")
pytestmark = [pytest.mark.launch, pytest.mark.slow]

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PEFT = {"lora_rank": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": TARGETS, "quantize_base": "nf4"}
#: every projection a whole number of NF4 scaler blocks (64 x 256 elements) per FSDP shard
SIZES = {"vocab_size": 512, "hidden_size": 256, "ffn_hidden_size": 512, "num_layers": 2, "num_attention_heads": 4,
         "num_kv_heads": 2, "max_position_embeddings": 64}
PROBE = torch.tensor([[5, 17, 99, 3, 250, 42, 7, 311, 64, 128, 2, 19]])


@pytest.fixture(scope="module")
def hf_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    out = tmp_path_factory.mktemp("hf") / "llama-256"
    config = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    LlamaForCausalLM(config).save_pretrained(out, safe_serialization=True)
    return out


def _train_records(run: Path) -> dict[int, tuple[float, float]]:
    records = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in records if r.get("split") == "train"}


def _nxd_logits_and_dequantised_base(hf: Path, ckpt_dir: Path, tag: str, out: Path) -> torch.Tensor:
    """nxd's QLoRA model rebuilt in one process from the HF folder and the checkpoint (adapters as
    trained); its NF4 base, dequantised, saved to ``out`` in Hugging Face format."""
    import nxd
    from nxd_ckpt.consolidate import full_model_state
    from nxd_ckpt.convert import single_rank
    from nxd_lora import LoraConfig
    from nxd_lora.quantize import dequantize_nf4_

    spec = nxd.get_model("llama")
    lora = LoraConfig(enable_lora=True, **{**PEFT, "lora_alpha": 8.0})
    with single_rank() as context:
        base = nxd.build_parallel_model(spec, json.loads((hf / "config.json").read_text()), context=context)
        spec.load_hf(base, str(hf))
        model = nxd.get_component("adapter", "lora")(base, lora)
        model.load_state_dict(full_model_state(str(ckpt_dir), tag), strict=True)  # the NF4 base is not in it
        with torch.no_grad():
            logits = model.eval()(input_ids=PROBE).logits.float()
        assert dequantize_nf4_(model.module) == 2 * 4  # fused qkv, o, fused gate/up, down per layer
        spec.save_hf(model.module, str(out))
    return logits


def test_qlora_fsdp_train_checkpoint_resume_export_peft(hf_base: Path, make_config, tmp_path: Path, capsys) -> None:
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    run, resumed = tmp_path / "run", tmp_path / "resumed"
    config = make_config(
        trainer={"max_steps": 4},
        distributed_strategy={"tensor_model_parallel_size": 1, "fsdp": True},
        model={**SIZES, "pretrained_checkpoint": str(hf_base), "optim": {"lr": 1e-2}},
        model_alignment_strategy={"peft": PEFT},
        exp_manager={"explicit_log_dir": str(run), "create_tensorboard_logger": False,
                     "checkpoint_callback_params": {"every_n_train_steps": 2, "save_top_k": -1}})
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(config))

    # 1. train from the HF weights (NF4 base) with checkpoints at steps 2 and 4
    assert main(["train", str(path)]) == 0
    first = _train_records(run)
    ckpts = run / "checkpoints"
    tags = {int(p.name.split("step=")[1].split("-")[0]): p.name for p in ckpts.iterdir() if "step=" in p.name}
    saved = json.loads((ckpts / tags[2] / "metadata.json").read_text())["tensors"]
    assert any(k.startswith("lora_layers.") for k in saved)
    assert not any(k.endswith(("qkv_proj.weight_qkv", "o_proj.weight", "gate_up_proj.weight", "down_proj.weight"))
                   for k in saved), sorted(saved)  # the frozen NF4 base stays out of checkpoints

    # 2. resume from step 2: the NF4 base quantised again from the HF folder, the rest from the checkpoint
    assert main(["train", str(path), f"exp_manager.explicit_log_dir={resumed}",
                 f"exp_manager.resume_from_checkpoint={ckpts / tags[2]}"]) == 0
    again = _train_records(resumed)
    assert sorted(again) == [3, 4] and all(again[s] == first[s] for s in again), (first, again)

    # 3. nxd eval of the checkpoint in one process: its adapters and other tensors, the NF4 base quantised
    # from the run's HF folder again (the checkpoint has none)
    capsys.readouterr()
    assert main(["eval", str(run), "trainer.limit_val_batches=1"]) == 0
    said = capsys.readouterr().out
    assert f"weights from checkpoint {ckpts / tags[4]} (step 4, written at TP 1 x PP 1 x DP 2, LoRA adapters included)" \
        in said, said
    val_loss = float(said.split("validation loss ")[1].split()[0])
    assert math.isfinite(val_loss), said

    # 4. the adapter leaves in PEFT's format (the base is the HF folder: merging is refused)
    out = tmp_path / "export"
    assert main(["ckpt", "convert", "--from", "nxd", "--to", "hf", str(run), "--lora", "adapter",
                 "--output", str(out)]) == 0
    assert not (out / "model.safetensors").exists()
    live, converted = (load_file(d / "adapter_model.safetensors")
                       for d in (ckpts / tags[4] / "lora_adapter", out / "lora_adapter"))
    assert sorted(live) == sorted(converted) and all(torch.equal(live[k], converted[k]) for k in live)
    capsys.readouterr()
    assert main(["ckpt", "convert", "--from", "nxd", "--to", "hf", str(run), "--lora", "merge",
                 "--output", str(tmp_path / "merged")]) != 0
    said = capsys.readouterr()
    assert "quantize_base='nf4'" in said.out + said.err, said

    # 5. PEFT loads the adapter onto the dequantised NF4 base: nxd's logits
    ours = _nxd_logits_and_dequantised_base(hf_base, ckpts, tags[4], tmp_path / "dequantised")
    peft = PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(str(tmp_path / "dequantised"),
                                                                      dtype=torch.float32), str(out / "lora_adapter"))
    with torch.no_grad():
        theirs = peft.eval()(PROBE).logits
    err = ((theirs - ours).abs().max() / ours.abs().max()).item()
    losses = [first[s][0] for s in sorted(first)]
    print(f"QLoRA on FSDP=2: loss {losses[0]:.4f} -> {losses[-1]:.4f}; resumed steps 3-4 bit-identical; "
          f"PEFT on the dequantised base vs nxd logits {err:.1e}")
    assert err < 1e-5
