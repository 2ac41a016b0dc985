"""ZeRO-1 with expert parallelism on 4 real gloo ranks: 10 AdamW steps with gradient clipping equal
one process training transformers' MixtralForCausalLM in fp64 on the same micro-batches, every step
taken from the ranks' own weights before it (teacher forcing): the losses and clipping norms, and
each weight after each step within the bound AdamW allows fp32 gradient rounding
(nxd_testing.reference.AdamWStepBound; a fixed tolerance on weights after AdamW steps failed on
another CPU, as Adam divides by the gradient's own magnitude). EP=2 x expert-DP=2: DP=4, dense state sharded over 4 ranks, expert state over
the 2 ranks holding the same experts, expert gradients summed over them and divided by 4."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from nxd.transforms import parallelize_model

sys.path.insert(0, str(Path(__file__).parent))
from mixtral_test_utils import (  # noqa: E402
    batch,
    hf_named_grads,
    lm_loss,
    quiet_transformers,
    save_hf,
)

from nxd_testing.reference import AdamWStepBound, max_rel, within_bound  # noqa: E402

quiet_transformers()

STEPS, BATCH, LR, MAX_NORM = 10, 4, 1e-2, 0.5
HPARAMS = {"lr": LR, "betas": (0.9, 0.95), "weight_decay": 0.1}


def zero1_body(tp: int, ep: int, hf_dir: str, batches: list[dict[str, torch.Tensor]]) -> dict | None:
    """Every rank trains its DP shard of each batch; rank 0 returns the DP-mean losses, the
    optimizer's clipping norms and the HF-named weights after each step."""
    import json

    import torch.distributed as dist

    import nxd
    from nxd_core_parallel import parallel_state
    from nxd_models_mixtral import MixtralConfig, MixtralForCausalLM, collect_hf_state_dict, load_hf_checkpoint
    from nxd_testing.reference import train_data_parallel

    cfg = nxd.neuronx_distributed_config(tensor_parallel_size=tp, expert_parallel_size=ep, optimizer_config={
        "zero_one_enabled": True, "grad_clipping": True, "max_grad_norm": MAX_NORM})
    config = MixtralConfig.from_dict(json.loads((Path(hf_dir) / "config.json").read_text()))
    model = parallelize_model(MixtralForCausalLM(config))
    load_hf_checkpoint(model, hf_dir)
    opt = nxd.initialize_parallel_optimizer(cfg, torch.optim.AdamW, model.parameters(), **HPARAMS)
    sharded = [layout.dp_size for layout in opt._layouts]
    weights = []
    run = train_data_parallel(model, opt, batches, group=parallel_state.get_data_parallel_group(), loss_of=lm_loss,
                              after_step=lambda: weights.append(collect_hf_state_dict(model)))
    losses, norms = run.losses, run.grad_norms
    if dist.get_rank() != 0:
        return None
    return {"losses": losses, "norms": norms, "weights": weights, "type": type(opt).__name__, "sharded": sharded}


def set_hf_named(model, weights: dict[str, torch.Tensor]) -> None:
    """Copy checkpoint-named weights into transformers' model (experts stacked in memory): the inverse
    of ``hf_named_grads``."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".mlp.gate.weight" in name:
                p.copy_(weights[name.replace(".mlp.gate.", ".block_sparse_moe.gate.")])
            elif ".mlp.experts.gate_up_proj" in name:
                prefix = name.replace(".mlp.experts.gate_up_proj", ".block_sparse_moe.experts.")
                for e in range(p.shape[0]):
                    p[e].copy_(torch.cat([weights[f"{prefix}{e}.w1.weight"], weights[f"{prefix}{e}.w3.weight"]]))
            elif ".mlp.experts.down_proj" in name:
                prefix = name.replace(".mlp.experts.down_proj", ".block_sparse_moe.experts.")
                for e in range(p.shape[0]):
                    p[e].copy_(weights[f"{prefix}{e}.w2.weight"])
            else:
                p.copy_(weights[name])


def check_against_hf(hf_dir: Path, batches: list[dict[str, torch.Tensor]], shards: int, result: dict) -> dict:
    """One process in fp64, each step from the ranks' weights before it: the mean over the DP shards
    of (CE + coef x HF aux loss), clip, AdamW. Returns the worst relative error of the losses and
    clipping norms, the largest fraction of its bound (AdamWStepBound) a weight used, the reference's
    losses and norms."""
    from transformers import MixtralForCausalLM

    model = MixtralForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float64, experts_implementation="eager")
    opt = torch.optim.AdamW(model.parameters(), **HPARAMS)
    step_bound = AdamWStepBound(opt)
    per = BATCH // shards
    losses, norms, used = [], [], (0.0, "")
    for step, data in enumerate(batches):
        if step:
            set_hf_named(model, result["weights"][step - 1])
        total = 0.0
        for i in range(shards):
            out = model(data["input_ids"][i * per:(i + 1) * per], output_router_logits=True)
            logits = out.logits.reshape(-1, out.logits.shape[-1])
            ce = F.cross_entropy(logits, data["labels"][i * per:(i + 1) * per].reshape(-1))
            total = total + (ce + model.config.router_aux_loss_coef * out.aux_loss) / shards
        total.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)))
        step_bound.grads_ready()
        opt.step()
        bounds = step_bound.stepped()
        losses.append(float(total.detach()))
        for p in model.parameters():  # name the weights and their bounds as the checkpoint does
            p.grad = p.detach().clone()
        want = hf_named_grads(model)
        for p in model.parameters():
            p.grad = bounds[p]
        used = max(used, within_bound(result["weights"][step], want, hf_named_grads(model)))
        opt.zero_grad()
    steps = max(max_rel(result["losses"], losses), max_rel(result["norms"], norms))
    return {"steps": steps, "weights": used, "losses": losses, "norms": norms}


@pytest.mark.slow
def test_zero1_with_expert_parallelism_matches_single_process(rank_pool, tmp_path):
    src = save_hf(tmp_path / "hf", seed=6)
    batches = [batch(seed=100 + s, batch_size=BATCH) for s in range(STEPS)]
    result = rank_pool(4).run(zero1_body, 1, 2, str(src), batches, timeout=600)[0]  # DP=4 = EP=2 x expert-DP=2
    assert result["type"] == "NeuronZero1Optimizer"
    assert sorted(result["sharded"]) == [2, 4]  # expert state over expert-DP, dense over DP
    ref = check_against_hf(src, batches, 4, result)
    assert min(ref["norms"]) > MAX_NORM * 0.5 and max(ref["norms"]) > MAX_NORM  # clipping acts
    assert ref["losses"][-1] < ref["losses"][0]
    # losses/norms: fp32 sums of a few thousand terms against fp64, at the same weights
    assert ref["steps"] <= 1e-5, f"losses/clipping norms: relative error {ref['steps']:.3g} > 1e-5"
    used, worst = ref["weights"]
    assert used <= 1.0, f"{worst}: difference {used:.3g} x its derived bound (AdamWStepBound)"
    print(f"\nZeRO-1 + EP=2 x expert-DP=2: losses/clipping norms within {ref['steps']:.3g}, "
          f"weights within {used:.3g} of their bound")
