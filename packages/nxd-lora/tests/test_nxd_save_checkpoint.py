"""``nxd.save_checkpoint`` of a LoRA model also writes the LoRA export its ``LoraConfig`` asks for
(through the ``nxd_checkpoint_extras`` hook nxd-ckpt calls), and PEFT/transformers load it; nxd
checks the export's checksums when it loads the adapter."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from nxd.transforms import parallelize_model

sys.path.insert(0, str(Path(__file__).parent))
from llama_lora_utils import batch, hf_logits, load_hf, make_peft_adapter, quiet, rel, save_base  # noqa: E402

import nxd  # noqa: E402


def _lora_model(base: Path, adapter: Path, **overrides):
    from nxd_lora.checkpoint import from_pretrained
    from nxd_models_llama import LlamaConfig, LlamaForCausalLM, load_hf_checkpoint

    model = parallelize_model(LlamaForCausalLM(LlamaConfig.from_dict(json.loads((base / "config.json").read_text()))))
    load_hf_checkpoint(model, base)
    return from_pretrained(model, adapter, **overrides)


def _trained(lora) -> None:
    """Move the adapters away from the file they were loaded from, so the export must be fresh."""
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_" in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.1)


def test_save_checkpoint_writes_peft_adapter_and_full_state_round_trips(tmp_path):
    import peft

    quiet()
    base = save_base("gqa", tmp_path / "base")
    adapter = make_peft_adapter(base, tmp_path / "peft")
    data = batch()
    lora = _lora_model(base, adapter)
    _trained(lora)
    with torch.no_grad():
        ours = lora(input_ids=data["input_ids"]).logits
    ckpt = tmp_path / "ckpt"
    nxd.save_checkpoint(str(ckpt), "step1", model=lora, user_content={"step": 1})

    exported = ckpt / "step1" / "lora_adapter"
    assert (exported / "adapter_config.json").is_file() and not (ckpt / "step1" / "base_model").exists()
    with torch.no_grad():
        theirs = peft.PeftModel.from_pretrained(load_hf(base), str(exported))(input_ids=data["input_ids"]).logits
        before = peft.PeftModel.from_pretrained(load_hf(base), str(adapter))(input_ids=data["input_ids"]).logits
    assert rel(before, theirs) > 1e-3  # the export holds the trained adapters, not the loaded ones
    err = rel(ours, theirs)
    print(f"PEFT logits on the exported adapter: max rel err {err:.1e}")
    assert err <= 1e-5

    # nxd's manifest (PEFT ignored it above) is checked when nxd loads the adapter: intact, it loads;
    # a flipped byte in the weights or in adapter_config.json is refused naming the file (issue 43)
    from nxd_core_parallel.file_checksums import ChecksumError

    manifest = json.loads((exported / "nxd_checksums.json").read_text())["files"]
    assert sorted(manifest) == ["adapter_config.json", "adapter_model.safetensors"], manifest
    _lora_model(base, exported)
    for name, at in (("adapter_model.safetensors", -5), ("adapter_config.json", 20)):
        damaged = tmp_path / f"damaged_{name}"
        shutil.copytree(exported, damaged)
        data = bytearray((damaged / name).read_bytes())
        data[at] ^= 1
        (damaged / name).write_bytes(bytes(data))
        with pytest.raises(ChecksumError, match=f"{damaged / name}: content checksum mismatch"):
            _lora_model(base, damaged)

    # The full sharded checkpoint still round-trips exactly into a fresh LoRA model.
    fresh = _lora_model(base, adapter)
    assert nxd.load_checkpoint(str(ckpt), "step1", model=fresh) == {"step": 1}
    want, got = lora.state_dict(), fresh.state_dict()
    assert want.keys() == got.keys()
    for key in want:
        assert torch.equal(want[key], got[key]), key


def test_save_checkpoint_merged_base_matches_transformers(tmp_path):
    quiet()
    base = save_base("gqa", tmp_path / "base")
    adapter = make_peft_adapter(base, tmp_path / "peft")
    data = batch()
    lora = _lora_model(base, adapter, save_lora_base=True, merge_lora=True)
    _trained(lora)
    with torch.no_grad():
        ours = lora(input_ids=data["input_ids"]).logits
    nxd.save_checkpoint(str(tmp_path / "ckpt"), "m", model=lora)
    step = tmp_path / "ckpt" / "m"
    assert not (step / "lora_adapter").exists()
    err = rel(ours, hf_logits(step / "base_model", data))
    print(f"transformers logits on the merged base: max rel err {err:.1e}")
    assert err <= 1e-5
    with torch.no_grad():  # saving merged left the live model unmerged
        assert torch.equal(lora(input_ids=data["input_ids"]).logits, ours)


def test_load_checkpoint_reloads_adapter_when_load_lora_from_ckpt(tmp_path):
    quiet()
    base = save_base("gqa", tmp_path / "base")
    adapter = make_peft_adapter(base, tmp_path / "peft")
    data = batch()
    lora = _lora_model(base, adapter)
    _trained(lora)
    nxd.save_checkpoint(str(tmp_path / "ckpt"), "s", model=lora)
    # Overwrite the exported adapter with the original: with load_lora_from_ckpt the adapter dir wins.
    exported = tmp_path / "ckpt" / "s" / "lora_adapter"
    (exported / "adapter_model.safetensors").write_bytes((adapter / "adapter_model.safetensors").read_bytes())
    (exported / "nxd_checksums.json").unlink()  # now PEFT's own adapter, which carries no nxd manifest
    fresh = _lora_model(base, adapter, load_lora_from_ckpt=False)
    fresh.lora_config.load_lora_from_ckpt = True
    nxd.load_checkpoint(str(tmp_path / "ckpt"), "s", model=fresh)
    with torch.no_grad():
        got = fresh(input_ids=data["input_ids"]).logits
        want = _lora_model(base, adapter)(input_ids=data["input_ids"]).logits
    assert torch.equal(got, want)
