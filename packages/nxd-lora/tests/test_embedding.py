"""LoRA on embeddings (NxD's ``LoraConfig.target_modules`` naming an ``nn.Embedding`` or a
vocabulary-parallel ``ParallelEmbedding``), PEFT as the oracle: PEFT adapts the same toy model
(its ``Embedding`` layer: ``lora_embedding_A/B``), writes the adapter, and nxd-lora loads it at
TP=1 and TP=2 (each rank holding half the vocabulary): outputs and every adapter gradient equal
PEFT's within 1e-5 relative, the export is PEFT's file tensor for tensor, and merging gives PEFT's
merged model. The nxd Llama at TP=2 with sequence parallelism adapts ``embed_tokens`` against PEFT
on transformers (logits, loss, gradients, trained adapter and merged export)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from nxd_lora import LoraConfig, LoRAModel, collect_adapter_state_dict, load_adapter

sys.path.insert(0, str(Path(__file__).parent))
from llama_lora_utils import batch, hf_logits, make_peft_adapter, peft_reference, quiet, rel, save_base  # noqa: E402

quiet()
VOCAB, DIM, OUT, PAD, TOL = 16, 8, 5, 1, 1e-5
CFG = dict(enable_lora=True, lora_rank=2, lora_alpha=4.0, target_modules=["emb", "head"])


class Toy(nn.Module):
    def __init__(self, emb: nn.Module | None = None) -> None:
        super().__init__()
        self.emb = emb if emb is not None else nn.Embedding(VOCAB, DIM, padding_idx=PAD)
        self.head = nn.Linear(DIM, OUT)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids))


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, VOCAB, (3, 7), generator=g)
    ids[0, :2] = PAD  # padding rows get no gradient, in PEFT's lookup as in the base's
    return ids, torch.randn(3, 7, OUT, generator=g)


def peft_side(tmp: Path) -> dict:
    """PEFT's adapter (every A and B drawn non-zero), outputs, gradients and merged outputs."""
    import peft

    torch.manual_seed(0)
    model = peft.get_peft_model(Toy(), peft.LoraConfig(r=2, lora_alpha=4.0, target_modules=["emb", "head"]))
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g))
    model.save_pretrained(str(tmp / "peft"))
    base_state = {k.replace("base_model.model.", "").replace("base_layer.", ""): v.clone()
                  for k, v in model.state_dict().items() if "lora_" not in k}
    ids, w = data()
    y = model(ids)
    (y * w).sum().backward()
    grads = {n.replace(".default", ""): p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    with torch.no_grad():
        merged = model.merge_and_unload()(ids)
    return {"base": base_state, "y": y.detach(), "grads": grads, "merged": merged, "dir": str(tmp / "peft")}


def nxd_side(base: dict, adapter_dir: str, tp: int) -> dict:
    """nxd-lora on the same base (at TP=2 a vocabulary-parallel table), the PEFT adapter loaded."""
    import torch.distributed as dist

    from nxd_testing.lora_reference import adapter_grads

    if tp == 1:
        model = Toy()
        model.load_state_dict(base)
    else:
        from nxd_core_parallel import parallel_state
        from nxd_tensor_parallel.parallel_layers import ParallelEmbedding

        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
        r, per = parallel_state.get_tensor_model_parallel_rank(), VOCAB // tp
        model = Toy(ParallelEmbedding(VOCAB, DIM, padding_idx=PAD))
        model.load_state_dict({**base, "emb.weight": base["emb.weight"][r * per:(r + 1) * per]})
    lora = LoRAModel(model, LoraConfig(**CFG))
    load_adapter(lora, adapter_dir)
    ids, w = data()
    y = lora(ids)
    (y * w).sum().backward()
    out = {"y": y.detach(), "grads": adapter_grads(lora), "export": collect_adapter_state_dict(lora),
           "frozen_clean": all(p.grad is None for p in model.parameters())}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    lora.merge_lora()
    with torch.no_grad():
        out["merged"] = lora(ids)
    lora.unmerge_lora()
    out["unmerge_exact"] = all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    return out if not dist.is_initialized() or dist.get_rank() == 0 else None


def test_embedding_lora_matches_peft_at_tp1_and_tp2(rank_pool, tmp_path):
    from safetensors.torch import load_file

    ref = peft_side(tmp_path)
    written = load_file(str(Path(ref["dir"]) / "adapter_model.safetensors"))
    assert written["base_model.model.emb.lora_embedding_A"].shape == (2, VOCAB)  # PEFT's own names and shapes
    assert written["base_model.model.emb.lora_embedding_B"].shape == (DIM, 2)
    for tp, res in ((1, nxd_side(ref["base"], ref["dir"], 1)),
                    (2, rank_pool(2).run(nxd_side, ref["base"], ref["dir"], 2)[0])):
        errs = {"y": rel(res["y"], ref["y"]), "merged": rel(res["merged"], ref["merged"])}
        assert set(res["grads"]) == set(ref["grads"]) == set(written)
        errs["grads"] = max(rel(res["grads"][k], ref["grads"][k]) for k in ref["grads"])
        print(f"\nTP={tp} embedding LoRA vs PEFT: {({k: f'{v:.1e}' for k, v in errs.items()})}")
        assert max(errs.values()) <= TOL, (tp, errs)
        for k, v in written.items():  # load -> export is PEFT's file, tensor for tensor
            assert torch.equal(res["export"][k], v), (tp, k)
        assert res["frozen_clean"] and res["unmerge_exact"]


def test_fresh_embedding_adapter_follows_peft_init():
    lora = LoRAModel(Toy(), LoraConfig(**CFG))
    piece = lora.adapters()["emb"][1].pieces["emb"]
    assert piece.lora_A.shape == (2, VOCAB) and piece.lora_B.shape == (DIM, 2)
    assert not piece.lora_A.any() and piece.lora_B.abs().min() > 0  # A zero, B N(0, 1): PEFT's rule


def llama_body(base_dir: str, peft_dir: str, out_dir: str, data: dict) -> dict | None:
    from test_llama_tp2 import lora_tp_body

    return lora_tp_body(base_dir, peft_dir, out_dir, data, True, 2, 2)


@pytest.mark.slow
def test_llama_embed_tokens_lora_tp2_sp_matches_peft(rank_pool, tmp_path):
    from safetensors.torch import load_file

    targets = ["embed_tokens", "q_proj", "down_proj"]
    base = save_base("gqa", tmp_path / "base")
    peft_dir = make_peft_adapter(base, tmp_path / "peft", targets=targets)
    data = batch()
    res = rank_pool(2).run(llama_body, str(base), str(peft_dir), str(tmp_path / "out"), data)[0]
    ref = peft_reference(base, peft_dir, data)
    errs = {"logits": rel(res["loaded_logits"], ref["logits"]), "loss": rel(res["loaded_loss"], ref["loss"])}
    assert set(res["grads"]) == set(ref["grads"]) and "base_model.model.model.embed_tokens.lora_embedding_A" in ref["grads"]
    errs["grads"] = max(rel(res["grads"][k], ref["grads"][k]) for k in ref["grads"])
    assert res["targets"] == sorted(targets) and res["losses"][-1] < res["losses"][0]
    adapter_dir = tmp_path / "out" / "adapter" / "lora_adapter"
    assert load_file(str(adapter_dir / "adapter_model.safetensors"))[
        "base_model.model.model.embed_tokens.lora_embedding_A"].shape == (4, 64)
    trained = peft_reference(base, adapter_dir, data)
    errs["trained_logits"] = rel(res["trained_logits"], trained["logits"])
    errs["merged_logits"] = rel(hf_logits(tmp_path / "out" / "merged" / "base_model", data), trained["logits"])
    assert res["unmerge_exact"]
    print(f"\nLlama TP=2+SP embed_tokens LoRA vs PEFT: {({k: f'{v:.1e}' for k, v in errs.items()})}")
    assert max(errs.values()) <= TOL, errs
