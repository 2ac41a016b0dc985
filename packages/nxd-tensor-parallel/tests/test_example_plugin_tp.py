"""The third-party template (integration_tests/example_plugin) under tensor parallelism: its model is
written for one device and declares its plan as data; nxd's ``parallel_plan`` transform shards it at
TP=2 (2 gloo ranks), and loss, logits and the gathered gradients equal the unsharded model's."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import nxd

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "integration_tests" / "example_plugin" / "src"))

from nxd_example_tinylm.model import TinyLM, TinyLMConfig  # noqa: E402
from nxd_example_tinylm.plugin import SPEC  # noqa: E402

from nxd_tensor_parallel.parallel_layers import ColumnParallelLinear, RowParallelLinear  # noqa: E402
from nxd_tensor_parallel.parallel_plan import plan_mismatches  # noqa: E402

#: fp32 loss and gradients of a sharded computation vs one process (docs/contributing.md)
TOL = 1e-5


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach() - b.detach()).abs().max() / b.detach().abs().max().clamp_min(1e-12))


def _full_grad(param: torch.Tensor, group: object) -> torch.Tensor:
    if not getattr(param, "tensor_model_parallel", False):
        return param.grad
    parts = [torch.empty_like(param.grad) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, param.grad.contiguous(), group=group)
    return torch.cat(parts, dim=param.partition_dim)


def tp2_body() -> dict[str, float]:
    config = nxd.neuronx_distributed_config(tensor_parallel_size=2)
    context = nxd.get_parallel_context()
    torch.manual_seed(0)
    reference = TinyLM(TinyLMConfig(vocab_size=64, hidden_size=32, num_heads=4))
    model = nxd.initialize_parallel_model(config, lambda: copy.deepcopy(reference), False).local_module()
    mlp = model.block.mlp
    assert isinstance(mlp[0], ColumnParallelLinear) and isinstance(mlp[2], RowParallelLinear)
    assert not plan_mismatches(model, SPEC.parallel_plan)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    out, ref = model(ids, labels=ids), reference(ids, labels=ids)
    out.loss.backward()
    ref.loss.backward()
    errors = {"loss": _rel(out.loss, ref.loss), "logits": _rel(out.logits, ref.logits)}
    ref_grads = {name: p.grad for name, p in reference.named_parameters()}
    for name, param in model.named_parameters():
        errors[name] = _rel(_full_grad(param, context.tp.group), ref_grads[name])
    return errors


def test_example_plugin_model_sharded_by_its_plan_matches_one_device(rank_pool):
    for rank, errors in enumerate(rank_pool(2).run(tp2_body)):
        worst = max(errors, key=errors.get)
        print(f"example plugin TP=2 rank {rank}: worst relative error {errors[worst]:.2e} ({worst})")
        assert errors[worst] <= TOL, (rank, worst, errors[worst])
        assert len(errors) == 2 + len(list(TinyLM(TinyLMConfig()).parameters()))  # every gradient compared
