"""parallel_layers.LayerNorm: torch's LayerNorm with parameters tagged for the SP gradient
all-reduce. A small model trained at TP=2 + SP through the NxD API matches one process training
the same model with plain torch, loss by loss and in the final LayerNorm parameters."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import nxd
from nxd_core_parallel import parallel_state as ps
from nxd_tensor_parallel.parallel_layers import (
    ColumnParallelLinear,
    LayerNorm,
    ParallelEmbedding,
    RowParallelLinear,
    parallel_cross_entropy,
)
from nxd_testing.reference import token_chain_batch, train_reference

VOCAB, HID, FFN, BATCH, SEQ, STEPS, LR = 16, 8, 16, 2, 8, 4, 0.02
TOL = 1e-5


class Net(nn.Module):
    def __init__(self, sp: bool) -> None:
        super().__init__()
        kw = {"sequence_parallel_enabled": sp, "sequence_dimension": 1}
        self.embed = ParallelEmbedding(VOCAB, HID, **kw)
        self.norm1 = LayerNorm(HID, eps=1e-5, sequence_parallel_enabled=sp)
        self.up = ColumnParallelLinear(HID, FFN, gather_output=False, **kw)
        self.down = RowParallelLinear(FFN, HID, input_is_parallel=True, **kw)
        self.norm2 = LayerNorm(HID, sequence_parallel_enabled=sp)
        self.head = ColumnParallelLinear(HID, VOCAB, bias=False, gather_output=False, **kw)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        h = h + self.down(F.gelu(self.up(self.norm1(h))))
        return parallel_cross_entropy(self.head(self.norm2(h)), labels).mean()


def build(sp: bool) -> Net:
    torch.manual_seed(11)
    return Net(sp)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Learnable: each token is followed by (3 * token + 1) mod VOCAB, from a random start.
    return token_chain_batch(step, batch=BATCH, seq=SEQ, vocab=VOCAB, seed=0)


def norm_params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if n.startswith("norm")}


def reference() -> tuple[list[float], dict[str, torch.Tensor]]:
    model = build(False)
    run = train_reference(model, torch.optim.AdamW(model.parameters(), lr=LR), (batch(s) for s in range(STEPS)))
    return run.losses, norm_params(model)


def tp_sp_body() -> tuple[list[float], dict[str, torch.Tensor], list[bool]]:
    cfg = nxd.neuronx_distributed_config(tensor_parallel_size=2, sequence_parallel=True,
                                         optimizer_config={"grad_clipping": False})
    model = nxd.initialize_parallel_model(cfg, build, False, True)
    opt = nxd.initialize_parallel_optimizer(cfg, torch.optim.AdamW, model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        losses.append(float(model.run_train(*batch(step))))
        opt.step()
        opt.zero_grad()
    tags = [getattr(p, "sequence_parallel_enabled", False) for n, p in model.named_parameters() if n.startswith("norm")]
    # Replicated parameters must stay identical across TP ranks.
    for p in norm_params(model).values():
        other = p.clone()
        dist.broadcast(other, src=ps.get_tensor_model_parallel_src_rank(), group=ps.get_tensor_model_parallel_group())
        assert torch.equal(p, other)
    return losses, norm_params(model), tags


def test_layer_norm_is_torch_layer_norm_with_tags():
    ln = LayerNorm(6, eps=1e-6, sequence_parallel_enabled=True)
    ref = nn.LayerNorm(6, eps=1e-6)
    with torch.no_grad():
        ln.weight.uniform_()
        ln.bias.uniform_()
    ref.load_state_dict(ln.state_dict())
    x = torch.randn(3, 6)
    assert torch.equal(ln(x), ref(x))
    for p in (ln.weight, ln.bias):
        assert p.sequence_parallel_enabled is True and p.tensor_model_parallel is False
    assert LayerNorm(4, bias=False).bias is None
    assert LayerNorm(4).weight.sequence_parallel_enabled is False


def test_tp2_sp_training_matches_single_process(rank_pool):
    want_losses, want_norms = reference()
    assert want_losses[-1] < want_losses[0], want_losses
    for losses, norms, tags in rank_pool(2).run(tp_sp_body):
        assert tags == [True] * 4
        worst = max(abs(a - b) / abs(b) for a, b in zip(losses, want_losses))
        worst_norm = max(float((norms[k] - v).abs().max() / v.abs().max()) for k, v in want_norms.items())
        print(f"TP=2+SP LayerNorm: max loss rel diff {worst:.2e}, norm params {worst_norm:.2e}")
        assert worst < TOL and worst_norm < TOL
