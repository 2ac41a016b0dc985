"""The ``context_parallel`` transform on a plain model (nothing of nxd's in it but a plan and an
``attention_core``), on 2 real gloo ranks at CP=2: each rank's output on its chunks equals the
one-process model's on the whole sequence at the same positions (fp32, ring attention vs SDPA, the
same bound as tests/test_ring_attention.py); a model whose plan names no attention, or names a
module without an ``attention_core``, is refused by name."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nxd.specs import ParallelPlan

TOL = 1e-5
SEQ, HEADS, KV_HEADS, HEAD_DIM = 16, 4, 2, 4


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """A plain model's own causal core (GQA: each KV head serves consecutive query heads)."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class TinyAttention(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.q = nn.Linear(width, HEADS * HEAD_DIM)
        self.kv = nn.Linear(width, 2 * KV_HEADS * HEAD_DIM)
        self.attention_core = sdpa_attention

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, HEADS, HEAD_DIM).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, KV_HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4)
        return self.attention_core(q, k, v, None).transpose(1, 2).reshape(b, s, -1)


class TinyLM(nn.Module):
    """Learned absolute positions: a wrong position on any CP rank changes its output."""

    nxd_parallel_plan = ParallelPlan(context_parallel=("attn",))

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.embed, self.pos = nn.Embedding(32, width), nn.Embedding(SEQ, width)
        self.attn = TinyAttention(width)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1]).expand_as(input_ids)
        return self.attn(self.embed(input_ids) + self.pos(position_ids))


def cp_body() -> dict:
    from nxd.errors import ConfigError
    from nxd.transforms import parallelize_model
    from nxd_context_parallel import local_indices
    from nxd_core_parallel import parallel_state

    parallel_state.initialize_model_parallel(context_parallel_size=2)
    torch.manual_seed(0)
    model = TinyLM()
    ids = torch.randint(0, 32, (2, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        whole = model(ids)
        parallelize_model(model)
        idx = local_indices(SEQ, parallel_state.get_context_model_parallel_rank(), 2)
        local = model(ids[:, idx])  # positions of this rank's chunks filled in by the transform
    err = float((local - whole[:, idx]).abs().max() / whole.abs().max())
    refusals = []
    for plan in (ParallelPlan(), ParallelPlan(context_parallel=("attn.q",))):
        other = TinyLM()
        other.nxd_parallel_plan = plan
        try:
            parallelize_model(other)
            refusals.append("accepted")
        except ConfigError as exc:
            refusals.append(str(exc))
    return {"err": err, "core": repr(model.attn.attention_core), "refusals": refusals}


def test_context_parallel_transform_runs_ring_attention_on_declared_attention(rank_pool) -> None:
    results = rank_pool(2).run(cp_body)
    for r in results:
        assert r["err"] <= TOL, results
        assert r["core"] == "RingAttentionCore(cp=2)"
        no_attention, no_core = r["refusals"]
        assert "context_parallel_size=2: TinyLM declares no attention for context parallelism" in no_attention
        assert "attn.q (Linear) is named context_parallel but has no attention_core" in no_core
