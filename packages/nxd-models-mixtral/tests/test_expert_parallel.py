"""Expert parallelism on real gloo ranks: EP=2, EP=2 x TP=2 and EP=2 x expert-DP=2 give the loss,
every gradient (after nxd's gradient sync: DP average, expert-DP reduction) and the clipping norm of
one process running the same micro-batches (transformers' MixtralForCausalLM, dropless routing)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from nxd.transforms import parallelize_model

sys.path.insert(0, str(Path(__file__).parent))
from mixtral_test_utils import batch, hf_named_grads, quiet_transformers, rel_err, save_hf  # noqa: E402

quiet_transformers()


def ep_body(tp: int, ep: int, hf_dir: str, data: dict[str, torch.Tensor], sequence_parallel: bool = False,
            checkpointing: bool = False) -> dict | None:
    """Every rank: its DP shard of ``data``, forward/backward, NxDOptimizer's gradient sync; rank 0
    returns the DP-mean loss, HF-named full grads and the global grad norm."""
    import json

    import torch.distributed as dist

    import nxd
    from nxd_core_parallel import parallel_state
    from nxd_core_parallel.grads import get_grad_norm
    from nxd_core_parallel.trainer import NxDOptimizer
    from nxd_models_mixtral import MixtralConfig, MixtralForCausalLM, collect_hf_state_dict, load_hf_checkpoint
    from nxd_moe import expert_parallel_groups

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, expert_model_parallel_size=ep)
    groups = expert_parallel_groups(nxd.current_parallel_context())
    dp, d = parallel_state.get_data_parallel_size(), parallel_state.get_data_parallel_rank()
    per = data["input_ids"].shape[0] // dp
    shard = {k: v[d * per:(d + 1) * per] for k, v in data.items()}
    config = MixtralConfig.from_dict(json.loads((Path(hf_dir) / "config.json").read_text()))
    model = parallelize_model(MixtralForCausalLM(config), config={"sequence_parallel": sequence_parallel})
    load_hf_checkpoint(model, hf_dir)
    if checkpointing:  # full activation checkpointing: each decoder layer (all-to-alls included) recomputed
        from nxd_core_parallel.activation_checkpoint import apply_activation_checkpointing

        assert apply_activation_checkpointing(model, MixtralForCausalLM.nxd_transformer_layer_classes) == 2
    experts = model.model.layers[0].block_sparse_moe.experts
    assert experts.num_local_experts == config.num_local_experts // ep
    out = model(shard["input_ids"], labels=shard["labels"])
    out.loss.backward()
    opt = NxDOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), {"optimizer_config": {"grad_clipping": False},
                                                              "sequence_parallel": sequence_parallel},
                       overlap_grad_sync=False)
    opt.sync_gradients()
    norm = get_grad_norm(list(model.parameters()))
    loss = out.loss.detach().clone()
    dist.all_reduce(loss, group=parallel_state.get_data_parallel_group())
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.grad.detach().clone()
    grads = collect_hf_state_dict(model)
    return {"loss": loss / dp, "grads": grads, "norm": norm, "edp": groups.edp_size} if dist.get_rank() == 0 else None


def hf_sharded_reference(hf_dir: Path, data: dict[str, torch.Tensor], shards: int) -> dict:
    """One process: the mean over the DP shards of (CE + coef x HF aux loss), backward once."""
    from transformers import MixtralForCausalLM

    model = MixtralForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    per = data["input_ids"].shape[0] // shards
    total = 0.0
    for i in range(shards):
        ids, labels = data["input_ids"][i * per:(i + 1) * per], data["labels"][i * per:(i + 1) * per]
        out = model(ids, output_router_logits=True)
        ce = F.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]), labels.reshape(-1))
        total = total + (ce + model.config.router_aux_loss_coef * out.aux_loss) / shards
    total.backward()
    grads = hf_named_grads(model)
    norm = torch.sqrt(sum(g.double().pow(2).sum() for g in grads.values()))
    return {"loss": total.detach(), "grads": grads, "norm": norm}


def _check(result: dict, ref: dict, tol: float = 1e-5) -> float:
    errors = {"loss": rel_err(result["loss"], ref["loss"]), "grad_norm": rel_err(result["norm"], ref["norm"])}
    assert set(result["grads"]) == set(ref["grads"])
    errors.update({k: rel_err(result["grads"][k], g) for k, g in ref["grads"].items()})
    worst = max(errors, key=errors.get)
    assert errors[worst] <= tol, f"{worst}: relative error {errors[worst]:.3g} > {tol}"
    return errors[worst]


def test_ep2_matches_single_process(rank_pool, tmp_path):
    """EP=2 (DP=2), plain and with full activation checkpointing."""
    src = save_hf(tmp_path / "hf")
    data = batch(batch_size=4)
    ref = hf_sharded_reference(src, data, 2)
    pool = rank_pool(2)
    worst = {ckpt: _check(pool.run(ep_body, 1, 2, str(src), data, False, ckpt, timeout=600)[0], ref) for ckpt in (False, True)}
    print(f"\nEP=2 (DP=2): worst relative error {worst[False]:.3g}; with activation checkpointing {worst[True]:.3g}")


def test_tp2_and_tp2_sequence_parallel_match_single_process(rank_pool, tmp_path):
    src = save_hf(tmp_path / "hf", seed=2)
    data = batch(seed=4)
    ref = hf_sharded_reference(src, data, 1)
    pool = rank_pool(2)
    worst = {sp: _check(pool.run(ep_body, 2, 1, str(src), data, sp, timeout=600)[0], ref) for sp in (False, True)}
    print(f"\nTP=2: worst relative error {worst[False]:.3g}; TP=2 + SP: {worst[True]:.3g}")


@pytest.mark.slow
def test_ep2_with_tp2_and_with_expert_dp2_match_single_process(rank_pool, tmp_path):
    src = save_hf(tmp_path / "hf", seed=3)
    data = batch(seed=5, batch_size=4)
    pool = rank_pool(4)
    tp2 = pool.run(ep_body, 2, 2, str(src), data, timeout=600)[0]  # TP=2 x EP=2 (DP=2)
    edp2 = pool.run(ep_body, 1, 2, str(src), data, timeout=600)[0]  # DP=4 = EP=2 x expert-DP=2
    assert edp2["edp"] == 2
    worst_tp = _check(tp2, hf_sharded_reference(src, data, 2))
    worst_edp = _check(edp2, hf_sharded_reference(src, data, 4))
    print(f"\nEP=2 x TP=2: worst relative error {worst_tp:.3g}; EP=2 x expert-DP=2: {worst_edp:.3g}")
