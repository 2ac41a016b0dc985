"""Llama under context parallelism on real gloo ranks against transformers' LlamaForCausalLM on the
whole batch in one process (fp32): the loss, the logits of each rank's tokens and every gradient.
CP=2, CP=2 x TP=2 (with sequence parallelism) and CP=2 x DP=2 (4 ranks); 10 optimizer steps at CP=2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from nxd.transforms import parallelize_model

sys.path.insert(0, str(Path(__file__).parent))
from llama_test_utils import CONFIGS, batch, hf_reference, quiet_transformers, rel_err, save_hf  # noqa: E402

from nxd_testing.reference import AdamWStepBound, within_bound  # noqa: E402

quiet_transformers()
TOL = 1e-5
CONFIG_GQA = {k: v for k, v in CONFIGS["gqa"].items() if v is not None}


def cp_body(tp: int, cp: int, hf_dir: str, data: dict, sequence_parallel: bool, loss_mask: bool) -> dict | None:
    import torch.distributed as dist

    from nxd_context_parallel import local_indices, split_batch_for_context_parallel
    from nxd_core_parallel import parallel_state
    from nxd_core_parallel.grads import allreduce_context_parallel_gradients, allreduce_sequence_parallel_gradients
    from nxd_models_llama import (
        LlamaConfig,
        LlamaForCausalLM,
        collect_hf_state_dict,
        gather_vocab_logits,
        load_hf_checkpoint,
    )

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, context_parallel_size=cp)
    cp_rank = parallel_state.get_context_model_parallel_rank()
    dp_rank, dp = parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_size()
    config = LlamaConfig.from_dict(json.loads((Path(hf_dir) / "config.json").read_text()))
    model = parallelize_model(LlamaForCausalLM(config), config={"sequence_parallel": sequence_parallel})
    load_hf_checkpoint(model, hf_dir)
    # DP ranks take their rows of the batch, CP ranks their chunks of the sequence
    rows = {k: v.chunk(dp)[dp_rank] for k, v in data.items()}
    local = split_batch_for_context_parallel(rows, cp_rank, cp)
    out = model(local["input_ids"], labels=local["labels"], position_ids=local["position_ids"],
                loss_mask=local.get("loss_mask"))
    out.loss.backward()
    params = list(model.parameters())
    if sequence_parallel:
        allreduce_sequence_parallel_gradients(params)
    allreduce_context_parallel_gradients(params)
    if dp > 1:
        for p in params:
            dist.all_reduce(p.grad, group=parallel_state.get_data_parallel_group())
            p.grad.div_(dp)
    loss = out.loss.detach().clone()
    if dp > 1:
        dist.all_reduce(loss, group=parallel_state.get_data_parallel_group())
        loss /= dp
    logits = gather_vocab_logits(out.logits).detach()
    with torch.no_grad():
        for p in params:
            p.data = p.grad.detach().clone()
    grads = collect_hf_state_dict(model)
    index = local_indices(data["input_ids"].shape[1], cp_rank, cp)
    return {"loss": loss, "logits": logits, "index": index, "dp_rank": dp_rank, "grads": grads}


def reference(hf_dir: Path, data: dict) -> dict:
    if "loss_mask" not in data:
        return hf_reference(hf_dir, data)
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    logits = model(data["input_ids"]).logits
    per_token = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), data["labels"].reshape(-1),
                                                  reduction="none")
    keep = data["loss_mask"].reshape(-1).float()
    loss = (per_token * keep).sum() / keep.sum()
    loss.backward()
    return {"logits": logits.detach(), "loss": loss.detach(),
            "grads": {n: p.grad.detach().clone() for n, p in model.named_parameters()}}


def check(results: list, ref: dict, dp: int) -> float:
    errors = {}
    for r, res in enumerate(results):
        errors[f"loss@{r}"] = rel_err(res["loss"], ref["loss"])
        rows = ref["logits"].chunk(dp)[res["dp_rank"]]
        errors[f"logits@{r}"] = rel_err(res["logits"], rows[:, res["index"]])
    grads = results[0]["grads"]  # global rank 0 assembles the full gradients
    assert set(grads) == set(ref["grads"]), set(grads) ^ set(ref["grads"])
    for name, g in grads.items():
        errors[name] = rel_err(g, ref["grads"][name])
    worst = max(errors, key=errors.get)
    assert errors[worst] <= TOL, f"{worst}: {errors[worst]:.3g} (all: {errors})"
    return errors[worst]


def data_with_mask(seed: int = 1) -> dict:
    data = batch(seed=seed)
    mask = torch.ones_like(data["input_ids"])
    mask[0, :5] = 0  # unequal supervised tokens per CP rank: the loss is still the mean over all
    mask[1, -3:] = 0
    return {**data, "loss_mask": mask}


@pytest.mark.parametrize("name", ["llama3_rope"])  # GQA (2 KV heads) and Llama 3.1 RoPE scaling
def test_cp2_matches_one_process(rank_pool, tmp_path, name: str) -> None:
    hf_dir = save_hf(name, tmp_path / name)
    data = data_with_mask()
    worst = check(rank_pool(2).run(cp_body, 1, 2, str(hf_dir), data, False, True), reference(hf_dir, data), 1)
    print(f"\nCP=2 {name}: worst relative error {worst:.2e}")


@pytest.mark.slow
@pytest.mark.parametrize("sequence_parallel", [True])  # TP layers with and without SP share the CP path
def test_cp2_tp2_matches_one_process(rank_pool, tmp_path, sequence_parallel: bool) -> None:
    hf_dir = save_hf("gqa", tmp_path / "gqa")
    data = data_with_mask()
    results = rank_pool(4).run(cp_body, 2, 2, str(hf_dir), data, sequence_parallel, True)
    worst = check(results, reference(hf_dir, data), 1)
    print(f"\nCP=2 x TP=2 (sp={sequence_parallel}): worst relative error {worst:.2e}")


@pytest.mark.slow
def test_cp2_dp2_matches_one_process(rank_pool, tmp_path) -> None:
    hf_dir = save_hf("gqa", tmp_path / "gqa")
    data = batch()
    results = rank_pool(4).run(cp_body, 1, 2, str(hf_dir), data, False, False)
    worst = check(results, reference(hf_dir, data), 2)
    print(f"\nCP=2 x DP=2: worst relative error {worst:.2e}")


def train_body(cp: int, steps: int, overlap: bool) -> dict:
    """``steps`` AdamW steps (clipping at 1.0) of a tiny Llama through NxDOptimizer at CP=``cp``
    (x DP = world / cp) in fp32, each checked against one fp64 step of the whole batch in this process
    from the same weights (teacher forcing, nxd_testing.reference.AdamWStepBound): worst relative
    error of the losses and clipping norms, and the largest fraction of its derived bound a weight used."""
    import torch.distributed as dist

    from nxd.parallel import set_parallel_context
    from nxd_context_parallel import split_batch_for_context_parallel
    from nxd_core_parallel import parallel_state
    from nxd_core_parallel.trainer import NxDOptimizer
    from nxd_models_llama import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig.from_dict(dict(CONFIG_GQA))
    data = [batch(seed=s) for s in range(steps)]
    torch.manual_seed(0)
    ref = parallelize_model(LlamaForCausalLM(config))
    start = {k: v.clone() for k, v in ref.state_dict().items()}
    ref.double()
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    step_bound = AdamWStepBound(opt)

    parallel_state.initialize_model_parallel(context_parallel_size=cp)
    model = parallelize_model(LlamaForCausalLM(config))
    model.load_state_dict(start)
    nxd_opt = NxDOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-2),
                           {"optimizer_config": {"grad_clipping": True, "max_grad_norm": 1.0}}, overlap_grad_sync=overlap)
    dp, dp_rank = parallel_state.get_data_parallel_size(), parallel_state.get_data_parallel_rank()
    errors = {"loss": 0.0, "grad_norm": 0.0, "weights": 0.0}
    ref_params, params = dict(ref.named_parameters()), dict(model.named_parameters())
    clipped = False
    for b in data:
        with torch.no_grad():  # the reference step starts from this run's weights
            for name, p in ref_params.items():
                p.copy_(params[name])
        outer = set_parallel_context(None)  # the reference is one process, no context parallelism
        ref_loss = ref(b["input_ids"], labels=b["labels"]).loss
        ref_loss.backward()
        set_parallel_context(outer)
        ref_norm = float(torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0))
        clipped |= ref_norm > 1.0
        step_bound.grads_ready()
        opt.step()
        bounds = step_bound.stepped()
        opt.zero_grad()

        rows = {k: v.chunk(dp)[dp_rank] for k, v in b.items()}
        local = split_batch_for_context_parallel(rows, parallel_state.get_context_model_parallel_rank(), cp)
        loss = model(local["input_ids"], labels=local["labels"], position_ids=local["position_ids"]).loss
        loss.backward()
        nxd_opt.step()
        nxd_opt.zero_grad()
        value = loss.detach().clone()
        dist.all_reduce(value, group=parallel_state.get_data_parallel_group())
        errors["loss"] = max(errors["loss"], abs(float(value) / dp - float(ref_loss)) / abs(float(ref_loss)))
        errors["grad_norm"] = max(errors["grad_norm"], abs(float(nxd_opt.grad_norm) - ref_norm) / ref_norm)
        used, _ = within_bound(params, ref_params, {k: bounds[p] for k, p in ref_params.items()})
        errors["weights"] = max(errors["weights"], used)
    assert clipped, "clipping must be exercised"
    return {**errors, "overlap": nxd_opt.overlap_grad_sync}


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [True])  # the after-backward path runs the same collective in step()
def test_cp2_ten_optimizer_steps_match_one_process(rank_pool, overlap: bool) -> None:
    results = rank_pool(2).run(train_body, 2, 10, overlap)
    assert all(r["overlap"] == overlap for r in results)
    loss, norm = max(r["loss"] for r in results), max(r["grad_norm"] for r in results)
    weights = max(r["weights"] for r in results)
    print(f"\nCP=2, 10 AdamW steps (overlap={overlap}): loss {loss:.2e}, grad norm {norm:.2e}, "
          f"weights {weights:.2e} of their bound")
    # weights: each step within what fp32 gradient rounding may move a weight through Adam
    assert loss < TOL and norm < TOL and weights <= 1.0, results


def refuse_body(hf_dir: str) -> str:
    from nxd_core_parallel import parallel_state
    from nxd_models_llama import LlamaConfig, LlamaForCausalLM

    parallel_state.initialize_model_parallel(context_parallel_size=2)
    config = LlamaConfig.from_dict(json.loads((Path(hf_dir) / "config.json").read_text()))
    model = parallelize_model(LlamaForCausalLM(config))
    ids = torch.zeros(1, 8, dtype=torch.long)
    segments = torch.tensor([[1, 1, 1, 2]]) if parallel_state.get_context_model_parallel_rank() else torch.ones(1, 4)
    model(ids[:, :4], attention_mask=torch.ones(1, 4, dtype=torch.long))  # one segment everywhere: fine
    try:
        model(ids[:, :4], attention_mask=segments.long())
    except ValueError as err:
        return str(err)
    return "accepted"


def test_cp_refuses_packed_segments_on_every_rank(rank_pool, tmp_path) -> None:
    hf_dir = save_hf("gqa", tmp_path / "gqa")
    messages = rank_pool(2).run(refuse_body, str(hf_dir))
    assert all("causal attention only" in m for m in messages), messages
