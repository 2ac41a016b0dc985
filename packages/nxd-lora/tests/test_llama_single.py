"""LoRA on the nxd Llama in one process (TP=1) against PEFT, for the adapter layouts the TP tests
do not cover: fused q/k/v and gate/up with only some projections targeted (the batched A and
block-diagonal B paths with zero-width blocks), and ``lora_dropout > 0`` (per-projection path)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from nxd.transforms import parallelize_model

sys.path.insert(0, str(Path(__file__).parent))
from llama_lora_utils import batch, make_peft_adapter, peft_reference, quiet, rel, save_base  # noqa: E402
from test_llama_tp2 import _adapter_grads  # noqa: E402

quiet()


@pytest.mark.parametrize("targets,dropout", [
    (["q_proj", "v_proj", "up_proj", "down_proj"], 0.0),   # k and gate untargeted inside fused layers
    (["k_proj", "gate_proj"], 0.0),
    (["q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"], 0.1),  # dropout modules (eval: identity)
])
def test_partial_fused_targets_match_peft(tmp_path, targets, dropout):
    import json

    from nxd_lora.checkpoint import from_pretrained
    from nxd_models_llama import LlamaConfig, LlamaForCausalLM, load_hf_checkpoint

    base = save_base("gqa", tmp_path / "base")
    adapter = make_peft_adapter(base, tmp_path / "peft", targets=targets, dropout=dropout)
    data = batch()
    model = parallelize_model(LlamaForCausalLM(LlamaConfig.from_dict(json.loads((base / "config.json").read_text()))))
    load_hf_checkpoint(model, base)
    lora = from_pretrained(model, adapter)
    assert lora.lora_config.lora_dropout == dropout
    if dropout:
        lora.eval()  # dropout off: a deterministic comparison that still runs the per-projection path
    with torch.no_grad():
        lora.set_adapters_enabled(False)
        base_logits = lora(input_ids=data["input_ids"]).logits
        lora.set_adapters_enabled(True)
    out = lora(input_ids=data["input_ids"], labels=data["labels"])
    out.loss.backward()
    ref = peft_reference(base, adapter, data) if not dropout else _peft_eval_reference(base, adapter, data)
    assert rel(base_logits, ref["logits"]) > 1e-3  # the adapter matters, so matching it means something
    errs = {"logits": rel(out.logits.detach(), ref["logits"]), "loss": rel(out.loss.detach(), ref["loss"])}
    grads = _adapter_grads(lora)
    assert set(grads) == set(ref["grads"]) and len(grads) == 2 * 2 * len(targets)
    errs["grads"] = max(rel(grads[k], ref["grads"][k]) for k in ref["grads"])
    print(targets, dropout, {k: f"{v:.1e}" for k, v in errs.items()})
    for key, err in errs.items():
        assert err <= 1e-5, f"{key} relative error {err:.2e}"


def _peft_eval_reference(base: Path, adapter: Path, data: dict) -> dict:
    from nxd_testing.lora_reference import peft_reference

    return peft_reference(base, adapter, data, eval_mode=True)

