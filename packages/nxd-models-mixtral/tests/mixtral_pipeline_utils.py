"""Shared pieces of the Mixtral pipeline tests (test_pipeline.py: 2 ranks;
test_expert_parallel_pipeline.py: 4 ranks): Mixtral under nxd-pipeline (PP=2, gloo ranks) against
the same model, same weights, at PP=1.

The router's load-balancing loss is Hugging Face's (all layers' tokens together), so each layer's
router gradient depends on every layer's expert counts; the stages pass the running router
statistics on with the hidden state (nxd_moe.pipeline). The reference is what PP=1 training
does with gradient accumulation: per micro-batch ``CE + coef x aux (+ z-loss)`` on that
micro-batch's tokens, backward of ``loss / num_microbatches``, reported loss = the mean.
The batch carries padding (segment 0) in some rows, so the masked statistics are exercised, and
a z-loss coefficient. fp32 loss and every gradient within 1e-5 relative.
"""

from __future__ import annotations

import torch

from nxd.transforms import parallelize_model
from nxd_testing.pipeline_reference import accumulated_reference

TOL = 1e-5
MICRO = 4
CONFIG = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, initializer_range=0.1,
              num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.1, output_router_logits=True,
              moe={"router_z_loss_coef": 0.01})


def micro_batches(count: int = MICRO, rows: int = 2, seq: int = 12) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, CONFIG["vocab_size"], (count * rows, seq + 1), generator=g)
    segments = torch.ones(count * rows, seq, dtype=torch.long)
    segments[::3, -4:] = 0  # padding: left out of the load-balancing statistics
    segments[1::2, 7:] = 2  # a second packed document
    batch = {"input_ids": ids[:, :-1], "labels": ids[:, 1:], "segment_ids": segments}
    return [{k: v[i * rows:(i + 1) * rows].contiguous() for k, v in batch.items()} for i in range(count)]


def build(sequence_parallel: bool, layers: int, checkpointing: bool = False):
    """The model from one seed; ``checkpointing``: every decoder layer recomputed in backward."""
    from nxd_core_parallel.activation_checkpoint import apply_activation_checkpointing
    from nxd_models_mixtral import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    config = MixtralConfig.from_dict(dict(CONFIG, num_hidden_layers=layers))
    model = parallelize_model(MixtralForCausalLM(config), config={"sequence_parallel": sequence_parallel})
    with torch.no_grad():  # larger router and expert weights: routing and the aux loss matter
        for name, p in model.named_parameters():
            if "block_sparse_moe" in name:
                p.normal_(0.0, 0.3)
    if checkpointing:
        assert apply_activation_checkpointing(model, MixtralForCausalLM.nxd_transformer_layer_classes) == layers
    return model


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def sp_grads(model) -> None:
    from nxd_core_parallel.grads import allreduce_sequence_parallel_gradients

    allreduce_sequence_parallel_gradients(list(model.parameters()))


def pp_body(tp: int, sequence_parallel: bool, schedule: str, virtual: int = 1, layers: int = 4,
            count: int = MICRO, checkpointing: bool = False) -> dict:
    from nxd_core_parallel import parallel_state
    from nxd_pipeline import NxDPPModel

    micro = micro_batches(count)
    # PP=1 reference on every rank (the same TP degree), gradient accumulation over the micro-batches
    parallel_state.initialize_model_parallel(tp, 1)
    reference = build(sequence_parallel, layers, checkpointing)
    ref_loss, _ = accumulated_reference(reference, micro)
    if sequence_parallel:
        sp_grads(reference)
    ref_grads = {n: p.grad for n, p in reference.named_parameters()}
    parallel_state.destroy_model_parallel()

    parallel_state.initialize_model_parallel(tp, 2)
    model = NxDPPModel(build(sequence_parallel, layers, checkpointing), 2, {"num_microbatches": len(micro), "schedule": schedule,
                                                            "virtual_pipeline_size": virtual})
    loss = model.run_train(*micro)
    if sequence_parallel:
        sp_grads(model.local_module())
    grads = {}
    for name, p in model.local_module().named_parameters():
        assert p.grad is not None, f"no gradient for {name}"
        grads[name] = rel(p.grad, ref_grads[name])
    return {"loss": rel(loss, ref_loss), "grads": grads, "all": sorted(ref_grads),
            "stage": parallel_state.get_pipeline_model_parallel_rank()}


def pp_ep_body(per_rank: int = 2) -> dict:
    """PP=2 x EP=2 (DP=2) on 4 ranks, 2 layers: each DP rank runs its ``per_rank`` micro-batches
    through the pipeline, NxDOptimizer syncs the gradients (DP mean; expert grads already hold both
    EP ranks' tokens); the reference is one model at PP=1, EP=1 accumulating all micro-batches."""
    import torch.distributed as dist

    import nxd
    from nxd_core_parallel import parallel_state
    from nxd_core_parallel.trainer import NxDOptimizer
    from nxd_moe import expert_parallel_groups
    from nxd_pipeline import NxDPPModel

    micro = micro_batches(2 * per_rank)
    parallel_state.initialize_model_parallel(1, 1)
    reference = build(False, 2)
    ref_loss, ref_grads = accumulated_reference(reference, micro)
    state = reference.state_dict()
    parallel_state.destroy_model_parallel()

    parallel_state.initialize_model_parallel(1, 2, expert_model_parallel_size=2)
    groups = expert_parallel_groups(nxd.current_parallel_context())
    d = parallel_state.get_data_parallel_rank()
    model = NxDPPModel(build(False, 2), 2, {"num_microbatches": per_rank, "schedule": "1f1b"})
    model.load_state_dict(state)
    loss = model.run_train(*micro[d * per_rank:(d + 1) * per_rank])
    dist.all_reduce(loss, group=parallel_state.get_data_parallel_group())
    params = list(model.local_module().parameters())
    NxDOptimizer(torch.optim.SGD(params, lr=0.0), {"optimizer_config": {"grad_clipping": False}},
                 overlap_grad_sync=False).sync_gradients()
    grads = {}
    for name, p in model.local_module().named_parameters():
        expected = ref_grads[name]
        if getattr(p, "expert_model_parallel", False):  # this EP rank's experts
            n = p.shape[0]
            expected = expected[groups.ep_rank * n:(groups.ep_rank + 1) * n]
        assert p.grad is not None and p.grad.shape == expected.shape, name
        grads[name] = rel(p.grad, expected)
    return {"loss": rel(loss / 2, ref_loss), "grads": grads, "all": sorted(ref_grads),
            "stage": parallel_state.get_pipeline_model_parallel_rank()}


def check(per_rank: list[dict], label: str) -> None:
    checked = {name for r in per_rank for name in r["grads"]}
    assert sorted(checked) == per_rank[0]["all"]  # every parameter is checked on some stage
    assert {r["stage"] for r in per_rank} == {0, 1}
    worst_loss = max(r["loss"] for r in per_rank)
    worst_grad = max(v for r in per_rank for v in r["grads"].values())
    print(f"\nMixtral {label} vs PP=1: loss rel {worst_loss:.2e}, grads rel {worst_grad:.2e}")
    assert worst_loss <= TOL and worst_grad <= TOL


def export_body(out_dir: str, layouts: list[tuple[int, int, int, int, bool]], layers: int = 4) -> dict:
    """HF export for each ``(pp, tp, ep, virtual, train)`` layout. The model at PP=1, TP=1 is
    written first; the PP=2 model imports that folder (strict), takes one step when ``train``
    (TP=EP=1: its stages' state dicts then merge into the PP=1 model), and exports. Global rank 0
    returns, per layout, whether the folder equals the PP=1 export of the same weights bit for bit,
    and nxd's logits at PP=1 (:func:`check_export` runs transformers on the folder against them)."""
    import torch.distributed as dist
    from safetensors.torch import load_file

    from nxd_core_parallel import parallel_state
    from nxd_models_mixtral import collect_hf_state_dict, load_hf_checkpoint, save_hf_checkpoint
    from nxd_pipeline import NxDPPModel, merge_stage_state_dicts

    parallel_state.initialize_model_parallel(1, 1)
    reference = build(False, layers)
    source = f"{out_dir}/pp1"
    save_hf_checkpoint(reference, source)
    parallel_state.destroy_model_parallel()
    out = {}
    for pp, tp, ep, virtual, train in layouts:
        parallel_state.initialize_model_parallel(tp, pp, expert_model_parallel_size=ep)
        config = {"num_microbatches": 2, "schedule": "interleaved_1f1b" if virtual > 1 else "1f1b",
                  "virtual_pipeline_size": virtual}
        model = NxDPPModel(build(False, layers), pp, config)
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
        load_hf_checkpoint(model, source)
        if train:
            model.run_train(*micro_batches(2))
            with torch.no_grad():  # every stage's weights move away from the PP=1 model's
                for p in model.parameters():
                    p -= 0.5 * p.grad
        folder = f"{out_dir}/pp{pp}_tp{tp}_ep{ep}_v{virtual}"
        save_hf_checkpoint(model, folder)
        if train:
            stages = [None] * dist.get_world_size()
            dist.all_gather_object(stages, {k: v.detach().clone() for k, v in model.state_dict().items()})
        parallel_state.destroy_model_parallel()
        parallel_state.initialize_model_parallel(1, 1)
        if train:
            reference.load_state_dict(merge_stage_state_dicts(stages))
        want = collect_hf_state_dict(reference)
        parallel_state.destroy_model_parallel()
        if dist.get_rank() != 0:
            continue
        got = load_file(f"{folder}/model.safetensors")
        ids = micro_batches(1)[0]["input_ids"]
        with torch.no_grad():
            logits = reference(ids).logits
        out[(pp, tp, ep, virtual)] = {"keys": sorted(got) == sorted(want), "folder": folder, "ids": ids,
                                  "equal": all(torch.equal(got[k], want[k]) for k in want), "logits": logits}
    return out


def check_export(result: dict) -> None:
    """Each layout's folder equals the PP=1 export, and transformers' logits on it nxd's at PP=1."""
    from nxd_testing.reference import quiet_transformers, rel_err

    quiet_transformers()
    from transformers import AutoModelForCausalLM

    assert result
    for layout, r in result.items():
        assert r["keys"] and r["equal"], layout
        with torch.no_grad():
            logits = AutoModelForCausalLM.from_pretrained(r["folder"], dtype=torch.float32)(r["ids"]).logits
        err = rel_err(logits, r["logits"])
        print(f"\nMixtral HF export (pp, tp, ep, virtual)={layout} vs PP=1: transformers logits rel {err:.2e}")
        assert err <= TOL
