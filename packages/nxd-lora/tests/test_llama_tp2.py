"""LoRA on the nxd Llama at TP=2 (two real gloo ranks) and TP=4 (replicated KV heads on 2 of 4
ranks each), with PEFT on transformers as the oracle.

One rank body per case: a PEFT-made adapter is loaded into nxd through
``neuronx_distributed_config(lora_config=...)`` + ``initialize_parallel_model`` (logits, loss and
every adapter gradient compared with PEFT's), then the adapter is trained for a few steps and
exported (adapter only, and merged into the base), and PEFT/transformers load the exports.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from nxd.transforms import parallelize_model

sys.path.insert(0, str(Path(__file__).parent))
from llama_lora_utils import (  # noqa: E402
    CONFIGS,
    RANK,
    TARGETS,
    batch,
    hf_logits,
    make_peft_adapter,
    peft_reference,
    quiet,
    rel,
    save_base,
)

quiet()
TOL = 1e-5


def _adapter_grads(lora) -> dict[str, torch.Tensor]:
    """Adapter gradients under PEFT keys, gathered over TP (nxd_testing.lora_reference)."""
    from nxd_testing.lora_reference import adapter_grads

    return adapter_grads(lora)


def lora_tp_body(base_dir: str, peft_dir: str, out_dir: str, data: dict, sp: bool, steps: int,
                 tp: int = 2) -> dict | None:
    import json

    import torch.distributed as dist

    import nxd
    from nxd_core_parallel.grads import allreduce_sequence_parallel_gradients
    from nxd_lora import LoraConfig
    from nxd_lora.checkpoint import save_lora_checkpoint, unwrap_lora
    from nxd_models_llama import LlamaConfig, LlamaForCausalLM, gather_vocab_logits, load_hf_checkpoint

    hf_config = json.loads((Path(base_dir) / "config.json").read_text())

    def build():
        model = parallelize_model(LlamaForCausalLM(LlamaConfig.from_dict(hf_config)), config={"sequence_parallel": sp})
        load_hf_checkpoint(model, base_dir)
        return model

    lora_config = LoraConfig(enable_lora=True, load_lora_from_ckpt=True, lora_save_dir=peft_dir)
    cfg = nxd.neuronx_distributed_config(tensor_parallel_size=tp, sequence_parallel=sp, lora_config=lora_config,
                                         optimizer_config={"zero_one_enabled": False, "grad_clipping": False,
                                                           "max_grad_norm": 1.0})
    model = nxd.initialize_parallel_model(cfg, build)
    lora = unwrap_lora(model)
    out = model(input_ids=data["input_ids"], labels=data["labels"])
    out.loss.backward()
    lora_params = list(lora.lora_layers.parameters())
    if sp:
        allreduce_sequence_parallel_gradients(lora_params)
    with_grads = sorted(n for n, p in model.named_parameters() if p.grad is not None)
    result = {"loaded_logits": gather_vocab_logits(out.logits).detach(), "loaded_loss": out.loss.detach(),
              "grads": _adapter_grads(lora), "with_grads": with_grads,
              "trainable": lora.trainable_parameters(), "targets": sorted(lora.lora_config.target_modules)}
    # a few training steps through nxd's optimizer wrapper, adapters only
    optimizer = nxd.initialize_parallel_optimizer(cfg, torch.optim.AdamW, [p for p in model.parameters()
                                                                          if p.requires_grad], lr=1e-2)
    optimizer.zero_grad()
    losses = []
    for _ in range(steps):
        losses.append(float(model.run_train(input_ids=data["input_ids"], labels=data["labels"])))
        optimizer.step()
        optimizer.zero_grad()
    result["losses"] = losses
    with torch.no_grad():
        result["trained_logits"] = gather_vocab_logits(model(input_ids=data["input_ids"]).logits)
    save_lora_checkpoint(model, out_dir, tag="adapter")
    before = {n: p.detach().clone() for n, p in lora.module.named_parameters()}
    lora.lora_config.save_lora_base, lora.lora_config.merge_lora = True, True
    save_lora_checkpoint(model, out_dir, tag="merged")
    result["unmerge_exact"] = all(torch.equal(p, before[n]) for n, p in lora.module.named_parameters())
    with torch.no_grad():
        result["after_merge_logits"] = gather_vocab_logits(model(input_ids=data["input_ids"]).logits)
    return result if dist.get_rank() == 0 else None


CASES = [("gqa", False), ("mqa", False), ("gqa", True)]


@pytest.mark.slow
def test_tp2_lora_matches_peft_both_ways(rank_pool, tmp_path):
    check_against_peft(rank_pool, tmp_path, 2, CASES, steps=3)


@pytest.mark.slow
def test_tp4_replicated_kv_lora_matches_peft_both_ways(rank_pool, tmp_path):
    # 2 KV heads at TP=4: kv_size_multiplier 2, KV head j on the neighbouring ranks 2j and 2j+1.
    check_against_peft(rank_pool, tmp_path, 4, [("gqa", False)], steps=2)


def check_against_peft(rank_pool, tmp_path: Path, tp: int, cases: list[tuple[str, bool]], steps: int) -> None:
    from safetensors.torch import load_file

    data = batch()
    worst: dict[str, float] = {}
    for name, sp in cases:
        case = f"{name}{'+sp' if sp else ''}"
        base = save_base(name, tmp_path / f"base_{name}")
        peft_dir = make_peft_adapter(base, tmp_path / f"peft_{name}")
        out = tmp_path / f"out_{case}"
        res = rank_pool(tp).run(lora_tp_body, str(base), str(peft_dir), str(out), data, sp, steps, tp)[0]
        ref = peft_reference(base, peft_dir, data)
        # PEFT adapter -> nxd at TP=2: logits, loss and every adapter gradient
        errs = {"logits": rel(res["loaded_logits"], ref["logits"]), "loss": rel(res["loaded_loss"], ref["loss"])}
        assert set(res["grads"]) == set(ref["grads"])
        errs["grads"] = max(rel(res["grads"][k], ref["grads"][k]) for k in ref["grads"])
        assert all(".lora_" in n for n in res["with_grads"]) and len(res["with_grads"]) == 2 * 2 * len(TARGETS)
        assert res["targets"] == sorted(TARGETS)
        # trained adapter -> PEFT on transformers
        assert res["losses"][-1] < res["losses"][0]
        adapter_dir = out / "adapter" / "lora_adapter"
        tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
        c = CONFIGS[name]
        kv = c["num_key_value_heads"] * c["hidden_size"] // c["num_attention_heads"]
        assert tensors["base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight"].shape == (kv, RANK)
        assert tensors["base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"].shape == (
            RANK, c["intermediate_size"])
        assert len(tensors) == 2 * 2 * len(TARGETS)
        trained_ref = peft_reference(base, adapter_dir, data)
        errs["trained_logits"] = rel(res["trained_logits"], trained_ref["logits"])
        # merged export == base + adapter; unmerge restored the base exactly
        errs["merged_logits"] = rel(hf_logits(out / "merged" / "base_model", data), trained_ref["logits"])
        assert not (out / "merged" / "lora_adapter").exists()
        assert res["unmerge_exact"]
        assert torch.equal(res["after_merge_logits"], res["trained_logits"])
        worst[case] = max(errs.values())
        print(case, {k: f"{v:.1e}" for k, v in errs.items()})
        for key, err in errs.items():
            assert err <= TOL, f"{case}: {key} relative error {err:.2e}"
    print(f"\nTP={tp} LoRA vs PEFT worst relative error per case: {worst}")
