"""One process: Mixtral imported from transformers' checkpoint gives the same logits, loss (with the
router aux loss) and gradients; export round-trips; greedy generation equals transformers'."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from mixtral_test_utils import batch, compare, hf_reference, nxd_forward_backward, quiet_transformers, save_hf  # noqa: E402

quiet_transformers()


@pytest.mark.parametrize("overrides", [{}, {"sliding_window": 5}], ids=["full", "sliding_window"])
def test_tp1_parity_logits_loss_grads(tmp_path, overrides):
    src = save_hf(tmp_path / "hf", **overrides)
    data = batch()
    worst = compare(nxd_forward_backward(str(src), data), hf_reference(src, data))
    print(f"\nTP=1 {overrides or 'full attention'}: worst relative error {worst:.3g}")


def test_export_roundtrip_and_generate(tmp_path):
    from safetensors.torch import load_file
    from transformers import MixtralForCausalLM as HF

    import nxd

    src = save_hf(tmp_path / "hf")
    spec = nxd.get_model("mixtral")
    model = nxd.build_parallel_model(spec, __import__("json").loads((src / "config.json").read_text()))
    spec.load_hf(model, str(src))
    spec.save_hf(model, str(tmp_path / "out"))
    a, b = load_file(str(src / "model.safetensors")), load_file(str(tmp_path / "out" / "model.safetensors"))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    exported = HF.from_pretrained(str(tmp_path / "out"))
    prompt = batch()["input_ids"][:, :5]
    expected = HF.from_pretrained(str(src)).generate(prompt, max_new_tokens=20, do_sample=False)
    assert spec.generate(model, prompt, 20).equal(expected)
    assert torch.equal(exported(prompt).logits, HF.from_pretrained(str(src))(prompt).logits)
