"""LoRA through the YAML (``model_alignment_strategy.peft``) at TP=2 on 2 gloo ranks: only the
adapters train, the loss falls, and every checkpoint exports a PEFT folder that
``peft.PeftModel.from_pretrained`` loads on transformers' Llama with the same logits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

RANK = 4
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PEFT = {"lora_rank": RANK, "lora_alpha": 8, "lora_dropout": 0.0, "save_lora_base": True, "target_modules": TARGETS}
PROBE = [[5, 17, 99, 3, 250, 42, 7, 311, 64, 128, 2, 19]]


def _pretrain(config: dict[str, Any], log_dir: str) -> dict[str, Any]:
    from nxd_training.config import load_config
    from nxd_training.loop import Trainer

    trainer = Trainer(load_config(config), Path(log_dir))
    try:
        result = trainer.fit()
        weights = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    finally:
        trainer.close()
    tag = f"tiny--step={result.final_step}-consumed_samples={result.final_step * 4}"
    return {"ckpt": str(Path(result.log_dir) / "checkpoints" / tag), "weights": weights}


def _train_lora(config: dict[str, Any], log_dir: str, base_weights: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
    import torch.distributed as dist

    from nxd_models_llama import gather_vocab_logits
    from nxd_training.config import load_config
    from nxd_training.loop import Trainer

    trainer = Trainer(load_config(config), Path(log_dir))
    try:
        start = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
        trainable = sorted(start)
        result = trainer.fit()
        after = dict(trainer.model.named_parameters())
        # every frozen parameter still equals the pretrained base's (loaded, then never updated)
        mine = base_weights[dist.get_rank()]
        frozen = {n.removeprefix("module."): p for n, p in after.items() if n not in start}
        frozen_same = sorted(frozen) == sorted(mine) and all(torch.equal(frozen[n], mine[n]) for n in mine)
        adapters_moved = sum(not torch.equal(start[n], after[n]) for n in trainable)
        trainer.model.eval()
        with torch.no_grad():
            logits = gather_vocab_logits(trainer.model(input_ids=torch.tensor(PROBE)).logits)
    finally:
        trainer.close()
    return {"losses": result.losses, "trainable": trainable, "counts": result.trainable_params,
            "frozen_same": frozen_same, "adapters_moved": adapters_moved, "logits": logits.float(),
            "exports": result.lora_exports}


def _peft_logits(base_dir: Path, adapter_dir: Path | None) -> torch.Tensor:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter_dir))
    model.eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor(PROBE)).logits.float()


@pytest.mark.slow
def test_lora_tp2_trains_adapters_and_exports_peft(rank_pool, make_config, tmp_path: Path) -> None:
    pool = rank_pool(2)
    # LoRA fine-tunes a trained base: pretrain briefly, then start from its weights only (NxDT's
    # resume_from_checkpoint + weight_init_only), with a fresh optimizer for the adapters
    pre = pool.run(_pretrain, make_config(trainer={"max_steps": 10}, model={"optim": {"lr": 2e-2}}),
                   str(tmp_path / "pretrain"))
    config = make_config(
        trainer={"max_steps": 6},
        model={"optim": {"lr": 5e-2}, "weight_init_only": True},
        model_alignment_strategy={"peft": PEFT},
        exp_manager={"resume_from_checkpoint": pre[0]["ckpt"],
                     "checkpoint_callback_params": {"every_n_train_steps": 3, "save_top_k": -1}},
    )
    results = pool.run(_train_lora, config, str(tmp_path / "run"), [r["weights"] for r in pre])
    r0 = results[0]
    # only adapters are trainable, every one of them moved, nothing else did
    assert r0["trainable"] and all("lora" in n for n in r0["trainable"]), r0["trainable"]
    assert r0["adapters_moved"] == len(r0["trainable"]) and r0["frozen_same"]
    losses = r0["losses"]
    print(f"LoRA TP=2: trainable {r0['counts'][0]} of {r0['counts'][1]} params per rank; "
          f"loss {losses[1]:.3f} -> {losses[6]:.3f}")
    assert losses[6] < losses[1] - 0.2, losses
    # one export per checkpoint, in NxD's layout <checkpoints>/<tag>/{lora_adapter, base_model}
    exports = [Path(p) for p in r0["exports"]]
    assert [p.name for p in exports] == ["tiny--step=3-consumed_samples=12", "tiny--step=6-consumed_samples=24"]
    final = exports[-1]
    adapter, base = final / "lora_adapter", final / "base_model"
    assert (adapter / "adapter_config.json").is_file() and (adapter / "adapter_model.safetensors").is_file()
    peft_cfg = json.loads((adapter / "adapter_config.json").read_text())
    assert peft_cfg["r"] == RANK and peft_cfg["lora_alpha"] == 8
    assert sorted(peft_cfg["target_modules"]) == sorted(TARGETS)
    # the exported adapter holds the whole (unsharded) adapter: r x in for A, out x r for B
    from safetensors.torch import load_file

    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    print(f"LoRA TP=2: exported adapter holds {sum(t.numel() for t in tensors.values())} parameters")
    hidden, ffn, layers, kv_dim = 32, 64, 2, 2 * (32 // 4)
    attention = 4 * RANK * hidden + RANK * (hidden + kv_dim + kv_dim + hidden)       # q, k, v, o: A + B
    mlp = 2 * (RANK * hidden + ffn * RANK) + (RANK * ffn + hidden * RANK)          # gate, up, down
    expected = layers * (attention + mlp)
    assert sum(t.numel() for t in tensors.values()) == expected
    # PEFT on transformers' Llama (base exported by nxd_models_llama's save_hf) = the nxd model
    ours = r0["logits"]
    theirs = _peft_logits(base, adapter)
    rel = ((theirs - ours).abs().max() / ours.abs().max()).item()
    print(f"LoRA TP=2: PEFT-loaded adapter vs nxd logits: max rel diff {rel:.2e}")
    assert rel < 1e-5, rel
    # the adapter matters: the base alone and the step-3 adapter give different logits
    assert ((_peft_logits(base, None) - ours).abs().max() / ours.abs().max()).item() > 1e-3
    early = _peft_logits(base, exports[0] / "lora_adapter")
    assert ((early - ours).abs().max() / ours.abs().max()).item() > 1e-4


@pytest.mark.slow
def test_lora_merged_export_at_end_without_checkpoints(rank_pool, make_config, tmp_path: Path) -> None:
    """save_lora_base + merge_lora: only a merged HF base is written; no checkpoints: at the end."""
    peft = {**PEFT, "merge_lora": True}
    config = make_config(trainer={"max_steps": 3}, model={"optim": {"lr": 5e-2}},
                         model_alignment_strategy={"peft": peft}, exp_manager={"create_checkpoint_callback": False})
    results = rank_pool(2).run(_train_lora, config, str(tmp_path / "run"), [{}, {}])
    r0 = results[0]
    [export] = [Path(p) for p in r0["exports"]]
    assert export == tmp_path / "run" / "lora"
    assert sorted(p.name for p in export.iterdir()) == ["base_model"]  # merged: no separate adapter
    assert r0["adapters_moved"] == len(r0["trainable"]) > 0  # so the merge changed the base
    ours = r0["logits"]
    merged = _peft_logits(export / "base_model", None)
    rel = ((merged - ours).abs().max() / ours.abs().max()).item()
    print(f"LoRA TP=2 merged export vs nxd logits: max rel diff {rel:.2e}")
    assert rel < 1e-5, rel
