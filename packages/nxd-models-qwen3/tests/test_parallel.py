"""Real gloo ranks against one process running transformers on the same micro-batches: loss, every
gradient after nxd's gradient sync (DP average, expert-DP reduction, SP all-reduce) and the global
gradient norm. Qwen3 at TP=2 (+SP, and with full activation checkpointing); Qwen3-MoE at EP=2 and
TP=2 + SP. The q/k head norms' weights see only their rank's heads: their gradient is summed over TP."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from qwen3_test_utils import batch, hf_reference, save_hf  # noqa: E402

from nxd_testing.reference import quiet_transformers, rel_err

quiet_transformers()


def parallel_body(tp: int, ep: int, hf_dir: str, data: dict[str, torch.Tensor], sequence_parallel: bool = False,
                  checkpointing: bool = False) -> dict | None:
    import torch.distributed as dist
    from qwen3_test_utils import build_from_hf

    from nxd_core_parallel import parallel_state
    from nxd_core_parallel.grads import get_grad_norm
    from nxd_core_parallel.trainer import NxDOptimizer
    from nxd_models_llama import collect_hf_state_dict as collect_dense
    from nxd_models_mixtral import collect_hf_state_dict as collect_moe
    from nxd_testing.reference import grads_into_parameters

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, expert_model_parallel_size=ep)
    dp, d = parallel_state.get_data_parallel_size(), parallel_state.get_data_parallel_rank()
    per = data["input_ids"].shape[0] // dp
    shard = {k: v[d * per:(d + 1) * per] for k, v in data.items()}
    spec, model = build_from_hf(hf_dir, sequence_parallel)
    if checkpointing:
        from nxd_core_parallel.activation_checkpoint import apply_activation_checkpointing

        assert apply_activation_checkpointing(model, spec.transformer_layer_classes) == model.config.num_hidden_layers
    out = model(shard["input_ids"], labels=shard["labels"])
    out.loss.backward()
    opt = NxDOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                       {"optimizer_config": {"grad_clipping": False}, "sequence_parallel": sequence_parallel},
                       overlap_grad_sync=False)
    opt.sync_gradients()
    norm = get_grad_norm(list(model.parameters()))
    loss = out.loss.detach().clone()
    dist.all_reduce(loss, group=parallel_state.get_data_parallel_group())
    grads_into_parameters(model)
    grads = (collect_moe if spec.name == "qwen3_moe" else collect_dense)(model)
    return {"loss": loss / dp, "grads": grads, "norm": norm} if dist.get_rank() == 0 else None


def check(result: dict, ref: dict, tol: float = 1e-5) -> float:
    errors = {"loss": rel_err(result["loss"], ref["loss"]), "grad_norm": rel_err(result["norm"], ref["norm"])}
    assert set(result["grads"]) == set(ref["grads"]), set(result["grads"]) ^ set(ref["grads"])
    errors.update({k: rel_err(result["grads"][k], g) for k, g in ref["grads"].items()})
    worst = max(errors, key=errors.get)
    assert errors[worst] <= tol, f"{worst}: relative error {errors[worst]:.3g} > {tol}"
    return errors[worst]


def test_qwen3_tp2_sp_and_checkpointing(rank_pool, tmp_path):
    src = save_hf(tmp_path / "hf", tie_word_embeddings=True)
    data = batch(seed=3)
    ref = hf_reference(src, data)
    pool = rank_pool(2)
    worst = {(sp, ckpt): check(pool.run(parallel_body, 2, 1, str(src), data, sp, ckpt, timeout=600)[0], ref)
             for sp, ckpt in ((False, False), (True, True))}
    print(f"\nqwen3 TP=2: {worst[(False, False)]:.3g}; TP=2 + SP + activation checkpointing: {worst[(True, True)]:.3g}")


def test_qwen3_moe_ep2_and_tp2_sp(rank_pool, tmp_path):
    src = save_hf(tmp_path / "hf", moe=True, seed=2)
    data = batch(seed=4, batch_size=4)
    pool = rank_pool(2)
    ep2 = check(pool.run(parallel_body, 1, 2, str(src), data, timeout=600)[0], hf_reference(src, data, 2))
    tp2 = check(pool.run(parallel_body, 2, 1, str(src), data, True, timeout=600)[0], hf_reference(src, data, 1))
    print(f"\nqwen3_moe EP=2 (DP=2): {ep2:.3g}; TP=2 + SP: {tp2:.3g}")
