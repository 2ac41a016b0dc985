"""Pipeline combined with tensor, data parallelism and activation checkpointing, through the NxD
facade (neuronx_distributed_config -> initialize_parallel_model/optimizer), against one process."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nxd
from nxd_core_parallel import parallel_state
from nxd_pipeline.toy import ToyLM, toy_batch
from nxd_tensor_parallel.parallel_layers import (
    ColumnParallelLinear,
    ParallelEmbedding,
    RowParallelLinear,
    parallel_cross_entropy,
)

STEPS, LR, MAX_NORM = 10, 0.2, 0.5


class TPBlock(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.up = ColumnParallelLinear(hidden, 4 * hidden, gather_output=False)
        self.down = RowParallelLinear(4 * hidden, hidden, input_is_parallel=True)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden + self.down(F.gelu(self.up(self.norm(hidden))))


class TPToyLM(nn.Module):
    """ToyLM on tensor-parallel layers (vocab-parallel embedding, head and loss)."""

    nxd_transformer_layer_classes = (TPBlock,)

    def __init__(self, vocab_size: int = 32, hidden: int = 16, num_layers: int = 4) -> None:
        super().__init__()
        self.embed = ParallelEmbedding(vocab_size, hidden)
        self.layers = nn.ModuleList(TPBlock(hidden) for _ in range(num_layers))
        self.norm = nn.LayerNorm(hidden)
        self.head = ColumnParallelLinear(hidden, vocab_size, bias=False, gather_output=False)

    def nxd_pipeline_layout(self) -> dict[str, Any]:
        return {"embed": ["embed"], "layers": "layers", "head": ["norm", "head"]}

    def nxd_pipeline_embed(self, input_ids: torch.Tensor, **_: Any) -> torch.Tensor:
        return self.embed(input_ids)

    def nxd_pipeline_head(self, hidden: torch.Tensor, labels: torch.Tensor, **_: Any) -> torch.Tensor:
        return parallel_cross_entropy(self.head(self.norm(hidden)), labels).mean()


def _shard_from(full: ToyLM) -> TPToyLM:
    """A TPToyLM holding this TP rank's shards of ``full``'s weights."""
    tp, rank = parallel_state.get_tensor_model_parallel_size(), parallel_state.get_tensor_model_parallel_rank()
    model = TPToyLM(num_layers=len(full.layers))
    source = full.state_dict()
    with torch.no_grad():
        for name, param in model.named_parameters():
            value = source[name]
            if getattr(param, "tensor_model_parallel", False):
                value = value.chunk(tp, dim=param.partition_dim)[rank]
            param.copy_(value)
    return model


def _reference_losses(full: ToyLM, batches: list[dict]) -> list[float]:
    model = copy.deepcopy(full)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for batch in batches:
        loss = model(**batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def _train(tp: int, pp: int, pipeline_config: dict, model_fn, batches: list[dict], **config: Any) -> list[float]:
    nxd_config = nxd.neuronx_distributed_config(
        tensor_parallel_size=tp, pipeline_parallel_size=pp, pipeline_config=pipeline_config,
        optimizer_config={"zero_one_enabled": False, "grad_clipping": True, "max_grad_norm": MAX_NORM}, **config,
    )
    model = nxd.initialize_parallel_model(nxd_config, model_fn)
    opt = nxd.initialize_parallel_optimizer(nxd_config, torch.optim.SGD, model.parameters(), lr=LR)
    losses = []
    for batch in batches:
        losses.append(float(model.run_train(**batch)))
        opt.step()
        opt.zero_grad()
    return losses


def tp_pp_body(schedule: str) -> tuple[list[float], list[float]]:
    torch.manual_seed(0)
    full = ToyLM(num_layers=4)
    batches = [toy_batch(4, 6, seed=s % 2) for s in range(STEPS)]
    reference = _reference_losses(full, batches)
    losses = _train(2, 2, {"num_microbatches": 2, "schedule": schedule}, lambda: _shard_from(full), batches)
    return losses, reference


def pp_dp_body(schedule: str, virtual: int) -> tuple[list[float], list[float]]:
    torch.manual_seed(0)
    full = ToyLM(num_layers=4, tie_embeddings=True)
    global_batches = [toy_batch(8, 6, seed=s % 2) for s in range(STEPS)]
    reference = _reference_losses(full, global_batches)
    parallel_state.initialize_model_parallel(1, 2)  # DP = world 4 / PP 2 = 2
    dp_rank = parallel_state.get_data_parallel_rank()
    mine = [{k: v.chunk(2)[dp_rank] for k, v in b.items()} for b in global_batches]
    losses = _train(1, 2, {"num_microbatches": 2, "schedule": schedule, "virtual_pipeline_size": virtual,
                     "broadcast_and_average_loss": True},
                    lambda: copy.deepcopy(full), mine, activation_checkpoint_config="full")
    return losses, reference


def _assert_same(per_rank: list[tuple[list[float], list[float]]]) -> None:
    worst = 0.0
    for losses, reference in per_rank:
        assert len(losses) == STEPS
        for got, want in zip(losses, reference):
            worst = max(worst, abs(got - want) / abs(want))
    print(f"max loss rel diff over {STEPS} steps: {worst:.2e}")
    assert worst <= 1e-5
    assert per_rank[0][1][-1] < per_rank[0][1][0]  # the run really trained


@pytest.mark.slow
def test_pp2_tp2_trains_like_one_process(rank_pool):
    _assert_same(rank_pool(4).run(tp_pp_body, "1f1b"))


@pytest.mark.slow
def test_pp2_dp2_interleaved_with_checkpointing_and_tied_embeddings(rank_pool):
    _assert_same(rank_pool(4).run(pp_dp_body, "interleaved_1f1b", 2))
