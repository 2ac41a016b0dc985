"""A plain transformers model parallelised by its ParallelPlan (the ``parallel_plan`` transform run by
``nxd.initialize_parallel_model``) computes what the unparallelised model does: logits, loss and
every gradient (gathered) on 2 real gloo ranks, fp32, within 1e-5 relative."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

import nxd
from nxd.errors import ConfigError
from nxd.specs import ParallelPlan
from nxd_tensor_parallel.parallel_plan import plan_mismatches
from nxd_tensor_parallel.tensor_plan import PLAN_ATTRIBUTE, parallelize, transformers_plan

transformers = pytest.importorskip("transformers")

#: fp32 sums in another order (the TP all-reduce splits each dot product in two): a few ulps of
#: the values compared, far below 1e-5 of their scale
TOL = 1e-5
SEQ, BATCH = 8, 2
TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=64)


def tiny_model(family: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if family == "llama":
        config = transformers.LlamaConfig(**TINY, tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(config)
    else:  # Qwen3: per-head q/k norms (partial gradients) and a tied LM head
        config = transformers.Qwen3Config(**TINY, tie_word_embeddings=True)
        model = transformers.Qwen3ForCausalLM(config)
    with torch.no_grad():  # norms away from 1 so their gradients are not trivially shaped
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.rand(p.shape, generator=torch.Generator().manual_seed(len(name))))
    return model.float()


def batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, TINY["vocab_size"], (BATCH, SEQ), generator=g)
    return {"input_ids": ids, "labels": ids.clone()}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach() - b.detach()).abs().max() / b.detach().abs().max().clamp_min(1e-12))


def full_grad(param: torch.Tensor, group: object, tp: int) -> torch.Tensor:
    """The whole gradient of a (possibly TP-sharded) parameter (test-side, plain collectives)."""
    if not getattr(param, "tensor_model_parallel", False) or tp == 1:
        return param.grad
    parts = [torch.empty_like(param.grad) for _ in range(tp)]
    dist.all_gather(parts, param.grad.contiguous(), group=group)
    return torch.cat(parts, dim=param.partition_dim)


def parity_body(family: str, tp: int) -> dict[str, float]:
    config = nxd.neuronx_distributed_config(tensor_parallel_size=tp)
    context = nxd.get_parallel_context()
    reference = tiny_model(family)

    def model_fn() -> torch.nn.Module:
        model = copy.deepcopy(reference)
        setattr(model, PLAN_ATTRIBUTE, transformers_plan(model))  # opt in: the model carries its plan
        return model

    wrapped = nxd.initialize_parallel_model(config, model_fn, False)
    model = wrapped.local_module()
    mismatches = plan_mismatches(model, transformers_plan(model))
    assert not mismatches, mismatches
    data = batch()
    out = model(**data)
    out.loss.backward()
    ref = reference(**data)
    ref.loss.backward()
    errors = {"logits": rel(out.logits, ref.logits), "loss": rel(out.loss, ref.loss)}
    ref_params = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        errors[name] = rel(full_grad(param, context.tp.group, tp), ref_params[name].grad)
    return errors


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_plain_transformers_model_parallelised_by_plan_matches_unparallelised(rank_pool, family):
    errors = rank_pool(2).run(parity_body, family, 2)
    for rank, errs in enumerate(errors):
        worst = max(errs, key=errs.get)
        print(f"\n{family} TP=2 rank {rank}: worst relative error {errs[worst]:.2e} ({worst})")
        assert errs[worst] <= TOL, (rank, worst, errs[worst])
        assert len(errs) > 2 + 10  # every parameter was compared


def test_transformers_plan_names_hf_tp_plan_and_embedding():
    model = tiny_model("qwen3")
    plan = transformers_plan(model)
    assert "model.layers.*.self_attn.q_proj" in plan.column and "model.layers.*.mlp.down_proj" in plan.row
    assert plan.gathered == ("lm_head",) and plan.vocab == ("model.embed_tokens",)
    assert "model.layers.*.self_attn.q_norm" in plan.partial_grad


def test_plan_refuses_what_it_cannot_shard():
    model = tiny_model("llama")
    with pytest.raises(ConfigError, match="sequence_parallel"):
        parallelize(model, transformers_plan(model), None, sequence_parallel=True)
    with pytest.raises(ConfigError, match=r"model\.norm is named column but is a LlamaRMSNorm"):
        parallelize(model, ParallelPlan(column=("model.norm",)), None)
    with pytest.raises(ConfigError, match=r"lm_head\.weight shares its weight with model\.embed_tokens"):
        tied = tiny_model("qwen3")
        parallelize(tied, ParallelPlan(vocab=("model.embed_tokens",)), None)


def test_plan_gives_the_configs_reduce_dtype_to_its_linear_layers():
    """``parallel_layers_reduce_dtype`` is set where the plan makes the layers (not looked for later)."""
    from nxd.transforms import parallelize_model
    from nxd_tensor_parallel.parallel_layers import ColumnParallelLinear, ParallelEmbedding, RowParallelLinear

    model = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8), torch.nn.Linear(8, 4))
    setattr(model, PLAN_ATTRIBUTE, ParallelPlan(vocab=("0",), column=("1",), row=("2",)))
    model = parallelize_model(model, None, nxd.neuronx_distributed_config(parallel_layers_reduce_dtype="bf16"))
    assert isinstance(model[0], ParallelEmbedding)
    assert isinstance(model[1], ColumnParallelLinear) and isinstance(model[2], RowParallelLinear)
    assert model[1].reduce_dtype == model[2].reduce_dtype == torch.bfloat16


def test_the_plan_places_a_plain_model_built_without_context_or_sp():
    """A family's constructor takes ``(config, device)`` only: the plan tags its ``sequence`` norms
    for the SP gradient sum and hands every ``PlacedByPlan`` module the context and SP it runs with."""
    from nxd_tensor_parallel.modules.plain import PlacedByPlan
    from nxd_tensor_parallel.modules.rms_norm import RMSNorm

    class Scatter(PlacedByPlan, torch.nn.Module):
        pass

    class Plain(PlacedByPlan, torch.nn.Module):
        nxd_parallel_plan = ParallelPlan(sequence=("norm",))

        def __init__(self) -> None:
            super().__init__()
            self.norm, self.inner = RMSNorm(4), Scatter()

    model = Plain()
    assert (model.inner.parallel_context, model.inner.sequence_parallel) == (None, False)
    assert not model.norm.weight.sequence_parallel_enabled
    parallelize(model, model.nxd_parallel_plan, None, sequence_parallel=True)
    assert model.inner.sequence_parallel and model.sequence_parallel and model.norm.weight.sequence_parallel_enabled
