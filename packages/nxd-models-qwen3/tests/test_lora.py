"""LoRA on Qwen3's projections in one process against PEFT on transformers' Qwen3 (the oracle): a
PEFT-written adapter (non-zero B) loaded by nxd-lora onto the model imported from the same
checkpoint gives the same logits, loss and every adapter gradient (under PEFT's keys) within 1e-5
relative (fp32). Dense: every projection (fused q/k/v and gate/up); MoE: the attention projections
(targeting the MLP names too, PEFT 0.21 wrote a ``rank_pattern`` for transformers' fused expert
``gate_up_proj``, which nxd-lora refuses by name)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from qwen3_test_utils import batch, build_from_hf, save_hf  # noqa: E402

from nxd_testing.lora_reference import adapter_grads, make_peft_adapter, peft_reference
from nxd_testing.reference import quiet_transformers, rel_err

quiet_transformers()

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
CASES = {"dense": (False, [*ATTENTION, "gate_proj", "up_proj", "down_proj"]),
         "moe_attention": (True, ATTENTION)}


@pytest.mark.parametrize("case", list(CASES))
def test_lora_on_qwen3_projections_matches_peft(tmp_path, case):
    from nxd_lora.checkpoint import from_pretrained

    moe, targets = CASES[case]
    src = save_hf(tmp_path / "hf", moe=moe, **({"output_router_logits": False} if moe else {}))  # loss: CE as PEFT's
    adapter = make_peft_adapter(src, tmp_path / "peft", targets)
    data = batch()
    _, model = build_from_hf(str(src))
    lora = from_pretrained(model, adapter)
    with torch.no_grad():
        lora.set_adapters_enabled(False)
        base_logits = lora(input_ids=data["input_ids"]).logits
        lora.set_adapters_enabled(True)
    out = lora(input_ids=data["input_ids"], labels=data["labels"])
    out.loss.backward()
    ref = peft_reference(src, adapter, data)
    assert rel_err(base_logits, ref["logits"]) > 1e-3  # the adapter matters
    grads = adapter_grads(lora)
    assert set(grads) == set(ref["grads"]) and grads, set(grads) ^ set(ref["grads"])
    errors = {"logits": rel_err(out.logits.detach(), ref["logits"]), "loss": rel_err(out.loss.detach(), ref["loss"]),
              **{k: rel_err(grads[k], g) for k, g in ref["grads"].items()}}
    worst = max(errors, key=errors.get)
    print(f"\nqwen3 LoRA {case} ({len(ref['grads'])} adapter tensors): worst {worst} {errors[worst]:.2e}")
    assert errors[worst] <= 1e-5, f"{worst}: relative error {errors[worst]:.3g}"
