"""transformers families nxd has no plugin for, trained through nxd's recipe on 2 real gloo ranks
(the rank pool), against the one-process transformers model loaded from the same folder: loss,
gradient norm and every gradient within 1e-5 relative (fp32). Layouts: TP=2 (transformers' own TP
plan through nxd's ``parallel_plan`` transform) and FSDP2 over DP=2 (nxd-fsdp's transform). The
build, weight load and step are the trainer's own calls: the spec's ``build`` bound to the context,
``initialize_parallel_model``, ``spec.load_hf``, ``run_train``, the strategy's optimizer ``step``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from families import FAMILIES, TP_FAMILIES, save_family

from nxd_testing.reference import random_lm_batch, rel_err

TOL = 1e-5
BATCH, SEQ, VOCAB = 4, 8, 64
MICROBATCHES = 2  # under PP
#: (family, layout) -> worst relative error, max abs gradient difference (printed as the report's table)
MEASURED: dict[tuple[str, str], tuple[float, float]] = {}


def hf_reference(hf_dir: str, data: dict[str, torch.Tensor], shards: int) -> dict:
    """transformers in one process: the mean over ``shards`` DP micro-batches of the aligned-label
    cross-entropy, backward once; gradients by parameter name (a tied head under its embedding's)."""
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    per = data["input_ids"].shape[0] // shards
    loss = 0.0
    for i in range(shards):
        logits = model(data["input_ids"][i * per:(i + 1) * per]).logits
        loss = loss + F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                      data["labels"][i * per:(i + 1) * per].reshape(-1)) / shards
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    norm = torch.sqrt(sum(g.double().pow(2).sum() for g in grads.values()))
    return {"loss": loss.detach(), "grads": grads, "norm": norm}


def whole_grads(module: torch.nn.Module, context) -> dict[str, torch.Tensor]:
    """Every local parameter's whole gradient: FSDP shards gathered, then TP shards (collective; a
    replicated K/V piece once); a later pipeline stage's copy of a tied weight left out (its first
    owner holds the summed one)."""
    from nxd_core_parallel.dtensor import SHARD_GROUP, full_rows
    from nxd_modeling.hf_interop import clean_param_name

    out = {}
    for raw, p in module.named_parameters():
        if getattr(p, "pipeline_shared_duplicate", False):
            continue
        g = full_rows(p.grad, getattr(p, SHARD_GROUP, None))
        if context.tp.size > 1 and getattr(p, "tensor_model_parallel", False):
            parts = [torch.empty_like(g) for _ in range(context.tp.size)]
            dist.all_gather(parts, g.contiguous(), group=context.tp.group)
            m = int(getattr(p, "kv_size_multiplier", 1) or 1)  # K/V replicated: one copy of each piece
            g = torch.cat(parts[::m], dim=p.partition_dim)
        out[clean_param_name(raw)] = g.detach().clone()
    return out


def recipe_body(hf_dir: str, data: dict[str, torch.Tensor], tp: int, fsdp: bool, pp: int = 1,
                export_dir: str | None = None) -> dict | None:
    """One rank: the trainer's build of the ``transformers`` spec for TP ``tp`` and PP ``pp``
    (FSDP2 over the DP ranks when ``fsdp``, else DDP), the folder's weights, one step on this rank's
    rows of ``data`` (under PP: 2 micro-batches through the 1F1B schedule). Each pipeline stage's
    first rank returns its stage's gradients, rank 0 the loss and norm too. ``export_dir``: the
    model's HF export after the step (learning rate 0: the folder's weights) written there."""
    import json

    import nxd

    spec = nxd.get_model("transformers")
    cfg = nxd.neuronx_distributed_config(tensor_parallel_size=tp, pipeline_parallel_size=pp,
                                         pipeline_config={"num_microbatches": MICROBATCHES} if pp > 1 else None,
                                         fsdp_config=True if fsdp else None,
                                         optimizer_config={"grad_clipping": True, "max_grad_norm": 1e9})
    context = nxd.get_parallel_context()
    model_config = spec.config_from_dict(json.loads((Path(hf_dir) / "config.json").read_text()))
    model = nxd.initialize_parallel_model(cfg, nxd.parallel.bind_context(spec.build, context), False, model_config, cfg)
    spec.load_hf(model, hf_dir)
    opt = nxd.initialize_parallel_optimizer(cfg, torch.optim.SGD, model.parameters(), lr=0.0)
    per = data["input_ids"].shape[0] // context.dp.size
    rows = {k: v[context.dp.rank * per:(context.dp.rank + 1) * per] for k, v in data.items()}
    if pp > 1:  # the step contract: the micro-batches the trainer hands a pipelined model
        half = per // MICROBATCHES
        loss = model.run_train(*({k: v[i * half:(i + 1) * half] for k, v in rows.items()}
                                 for i in range(MICROBATCHES))).detach().clone()
    else:
        loss = model.run_train(rows).detach().clone()
    opt.step()  # gradient sync, the clipping norm (max_norm far above it: nothing clipped), lr 0
    dist.all_reduce(loss, group=context.dp.group)
    grads = whole_grads(model.module if hasattr(model, "module") else model, context)
    if export_dir is not None:
        spec.save_hf(model, export_dir)
    if context.tp.rank or context.dp.rank:
        return None
    return {"loss": loss / context.dp.size, "norm": opt.grad_norm, "grads": grads}


def merged(per_rank: list[dict | None]) -> dict:
    """Rank 0's loss and norm with every pipeline stage's gradients (each parameter on one stage)."""
    results = [r for r in per_rank if r is not None]
    grads: dict[str, torch.Tensor] = {}
    for result in results:
        assert not set(grads) & set(result["grads"]), set(grads) & set(result["grads"])
        grads.update(result["grads"])
    return {**results[0], "grads": grads}


def check(family: str, layout: str, result: dict, ref: dict) -> None:
    assert set(result["grads"]) == set(ref["grads"]), set(result["grads"]) ^ set(ref["grads"])
    errors = {"loss": rel_err(result["loss"], ref["loss"]), "grad_norm": rel_err(result["norm"], ref["norm"])}
    errors.update({k: rel_err(result["grads"][k], g) for k, g in ref["grads"].items()})
    worst = max(errors, key=errors.get)
    abs_diff = max(float((result["grads"][k].double() - g.double()).abs().max()) for k, g in ref["grads"].items())
    MEASURED[(family, layout)] = (errors[worst], abs_diff)
    print(f"\n{family} {layout}: worst relative error {errors[worst]:.2e} ({worst}), max abs gradient diff "
          f"{abs_diff:.2e}, loss diff {float(abs(result['loss'] - ref['loss'])):.2e}")
    assert errors[worst] <= TOL, (family, layout, worst, errors[worst])


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("families")
    return {family: str(save_family(family, root / family)) for family in FAMILIES}


@pytest.mark.parametrize("family", TP_FAMILIES)
def test_tp2_matches_transformers(rank_pool, folders, family):
    data = random_lm_batch(7, BATCH, SEQ, VOCAB)
    result = rank_pool(2).run(recipe_body, folders[family], data, 2, False)[0]
    check(family, "TP=2", result, hf_reference(folders[family], data, 1))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_fsdp_dp2_matches_transformers(rank_pool, folders, family):
    data = random_lm_batch(8, BATCH, SEQ, VOCAB)
    result = rank_pool(2).run(recipe_body, folders[family], data, 1, True)[0]
    check(family, "FSDP=2", result, hf_reference(folders[family], data, 2))


def assert_same_tensors(exported: Path, original: str) -> None:
    """The export holds the folder's tensors exactly (a tied head stored in neither)."""
    from safetensors.torch import load_file

    ours, theirs = load_file(str(exported / "model.safetensors")), load_file(str(Path(original) / "model.safetensors"))
    assert sorted(ours) == sorted(theirs) and [k for k in ours if not torch.equal(ours[k], theirs[k])] == []


@pytest.mark.parametrize("family", list(FAMILIES))
def test_pp2_matches_transformers(rank_pool, folders, family, tmp_path):
    """PP=2: nxd-pipeline's split of transformers' forward (nxd_pipeline.hf_decoder), one layer
    per stage, 1F1B over 2 micro-batches; the reference is their mean loss in one process. The HF
    export from the stages (learning rate 0) is the folder's tensors."""
    data = random_lm_batch(11, BATCH, SEQ, VOCAB)
    result = merged(rank_pool(2).run(recipe_body, folders[family], data, 1, False, 2, str(tmp_path / "export")))
    check(family, "PP=2", result, hf_reference(folders[family], data, MICROBATCHES))
    assert_same_tensors(tmp_path / "export", folders[family])


@pytest.mark.four_ranks
@pytest.mark.parametrize("family", TP_FAMILIES)
def test_pp2_tp2_matches_transformers(rank_pool, folders, family, tmp_path):
    data = random_lm_batch(12, BATCH, SEQ, VOCAB)
    result = merged(rank_pool(4).run(recipe_body, folders[family], data, 2, False, 2, str(tmp_path / "export")))
    check(family, "PP=2 x TP=2", result, hf_reference(folders[family], data, MICROBATCHES))
    assert_same_tensors(tmp_path / "export", folders[family])


#: families whose TP plan shards separate k_proj / v_proj column-wise (K/V heads replicable over TP)
KV_REPLICABLE = ("gemma3_text", "granite", "starcoder2")


@pytest.mark.parametrize("family", KV_REPLICABLE)
def test_tp2_with_one_kv_head_replicates_it(rank_pool, family, tmp_path):
    """1 K/V head at TP=2: both ranks hold it (kv_size_multiplier 2), each with 2 of the 4 query
    heads; its gradient is summed over the two."""
    hf = str(save_family(family, tmp_path / family, num_key_value_heads=1))
    data = random_lm_batch(13, BATCH, SEQ, VOCAB)
    result = rank_pool(2).run(recipe_body, hf, data, 2, False, 1, str(tmp_path / "export"))[0]
    check(family, "TP=2, 1 KV head", result, hf_reference(hf, data, 1))
    assert_same_tensors(tmp_path / "export", hf)


@pytest.mark.four_ranks
def test_tp4_with_two_kv_heads_replicates_them(rank_pool, tmp_path):
    """2 K/V heads at TP=4: each on 2 neighbouring ranks, one query head per rank."""
    hf = str(save_family("granite", tmp_path / "granite"))
    data = random_lm_batch(14, BATCH, SEQ, VOCAB)
    result = rank_pool(4).run(recipe_body, hf, data, 4, False, 1, str(tmp_path / "export"))[0]
    check("granite", "TP=4, 2 KV heads", result, hf_reference(hf, data, 1))
    assert_same_tensors(tmp_path / "export", hf)


@pytest.mark.parametrize("family", ["olmo2", "phi3"])
def test_tp2_with_one_kv_head_gathered_needs_no_replication(rank_pool, family, tmp_path):
    """A plan gathering K/V whole (OLMo 2's q/k/v, Phi-3's fused qkv_proj): 1 K/V head at TP=2
    needs no placement, every rank attends over all heads."""
    hf = str(save_family(family, tmp_path / family, num_key_value_heads=1))
    data = random_lm_batch(15, BATCH, SEQ, VOCAB)
    result = rank_pool(2).run(recipe_body, hf, data, 2, False)[0]
    check(family, "TP=2, 1 KV head (gathered)", result, hf_reference(hf, data, 1))
