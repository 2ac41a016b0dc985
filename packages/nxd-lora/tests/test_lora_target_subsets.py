"""LoRA on a subset of a fused projection (q/k/v, gate/up) at TP=2 and TP=4, with and without
KV replication, against PEFT on transformers in both directions:

* PEFT -> nxd: a PEFT adapter on those targets loads into the TP model with PEFT's logits;
* nxd -> PEFT: adapters initialised by nxd (not loaded) are trained for two steps, exported, and
  PEFT's logits from the export equal the TP model's. This caught replicated LoRA A matrices that
  were initialised from each rank's own RNG, so the trained TP model matched no export.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import pytest
import torch

from nxd.transforms import parallelize_model

sys.path.insert(0, str(Path(__file__).parent))
from llama_lora_utils import ALPHA, RANK, batch, make_peft_adapter, peft_reference, quiet, rel, save_base  # noqa: E402

quiet()
TOL = 1e-5
QKV = ["q_proj", "k_proj", "v_proj"]
GATE_UP = ["gate_proj", "up_proj"]
# every non-empty subset of q/k/v, each paired with one subset of gate/up (all three occur)
SUBSETS = [list(qkv) + [GATE_UP, [GATE_UP[0]], [GATE_UP[1]], []][i % 4]
           for i, qkv in enumerate(c for n in (1, 2, 3) for c in itertools.combinations(QKV, n))]


def subsets_body(cases: list[tuple[str, str, str, list[str]]], data: dict, tp: int) -> list[dict] | None:
    """Every ``(base_dir, peft_dir, out_dir, targets)`` case in one task: one rank launch per TP layout."""
    import torch.distributed as dist

    results = [subset_body(*case, data, tp) for case in cases]
    return results if dist.get_rank() == 0 else None


def subset_body(base_dir: str, peft_dir: str, out_dir: str, targets: list[str], data: dict, tp: int) -> dict:
    import torch.distributed as dist

    import nxd
    from nxd_core_parallel import parallel_state
    from nxd_lora import LoraConfig
    from nxd_lora.checkpoint import save_lora_checkpoint
    from nxd_models_llama import LlamaConfig, LlamaForCausalLM, gather_vocab_logits, load_hf_checkpoint

    hf_config = json.loads((Path(base_dir) / "config.json").read_text())

    def build():
        model = parallelize_model(LlamaForCausalLM(LlamaConfig.from_dict(hf_config)))
        load_hf_checkpoint(model, base_dir)
        return model

    def parallel_model(lora_config):
        parallel_state.destroy_model_parallel()
        return nxd.initialize_parallel_model(nxd.neuronx_distributed_config(tensor_parallel_size=tp, lora_config=lora_config), build)

    loaded = parallel_model(LoraConfig(enable_lora=True, load_lora_from_ckpt=True, lora_save_dir=peft_dir))
    with torch.no_grad():
        loaded_logits = gather_vocab_logits(loaded(input_ids=data["input_ids"]).logits)
    torch.manual_seed(1234 + dist.get_rank())  # ranks' RNGs differ, as they do after model building
    cfg = nxd.neuronx_distributed_config(tensor_parallel_size=tp, lora_config=LoraConfig(
        enable_lora=True, target_modules=targets, lora_rank=RANK, lora_alpha=ALPHA))
    fresh = nxd.initialize_parallel_model(cfg, build)
    optimizer = nxd.initialize_parallel_optimizer(cfg, torch.optim.AdamW, [p for p in fresh.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):
        fresh.run_train(input_ids=data["input_ids"], labels=data["labels"])
        optimizer.step()
        optimizer.zero_grad()
    with torch.no_grad():
        trained_logits = gather_vocab_logits(fresh(input_ids=data["input_ids"]).logits)
    save_lora_checkpoint(fresh, out_dir, tag="adapter")
    return {"loaded": loaded_logits, "trained": trained_logits} if dist.get_rank() == 0 else {}


# TP=4 (4 ranks on a 2-core CI machine) checks the single projections and one mixed subset
CASES = {2: [("gqa", SUBSETS), ("mqa", SUBSETS)], 4: [("gqa", [["q_proj"], ["k_proj", "gate_proj"], ["v_proj", "up_proj"]])]}


@pytest.mark.slow
@pytest.mark.parametrize("tp", sorted(CASES), ids=["tp2-gqa-and-kv-replicated", "tp4-kv-replicated"])
def test_fused_projection_subsets_match_peft_both_ways(rank_pool, tmp_path, tp):
    data = batch()
    cases = []
    for kind, subsets in CASES[tp]:
        base = save_base(kind, tmp_path / f"base_{kind}")
        for targets in subsets:
            case = f"{kind}:" + "+".join(t.removesuffix("_proj") for t in targets)
            peft_dir = make_peft_adapter(base, tmp_path / f"peft_{case}", targets=targets)
            cases.append((case, base, peft_dir, tmp_path / f"out_{case}", targets))
    pool = rank_pool(tp)  # every case in one task, with the time budget each case had as a task of its own
    results = pool.run(subsets_body, [(str(b), str(p), str(o), t) for _, b, p, o, t in cases], data, tp,
                       timeout=pool.timeout * len(cases))[0]
    worst = {}
    for (case, base, peft_dir, out, targets), res in zip(cases, results):
        errs = {"peft->nxd": rel(res["loaded"], peft_reference(base, peft_dir, data)["logits"]),
                "nxd->peft": rel(res["trained"], peft_reference(base, out / "adapter" / "lora_adapter", data)["logits"])}
        worst[case] = max(errs.values())
        for key, err in errs.items():
            assert err <= TOL, f"TP={tp} {case} targets {targets}: {key} relative logits error {err:.2e}"
    print(f"\nTP={tp}: worst relative logits error per target subset: "
          + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()))
