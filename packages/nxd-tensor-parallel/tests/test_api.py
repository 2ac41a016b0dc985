"""Parallel state layout and errors, RNG tracker, activation checkpointing, model init, wrappers, backends."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import nxd
from nxd_core_parallel import backends
from nxd_core_parallel import parallel_state as ps
from nxd_core_parallel.activation_checkpoint import apply_activation_checkpointing
from nxd_core_parallel.model_init import run_in_waves
from nxd_core_parallel.random import get_rng_tracker, model_parallel_manual_seed
from nxd_core_parallel.trainer import NxDModel, NxDOptimizer
from nxd_tensor_parallel.parallel_layers import ColumnParallelLinear, RowParallelLinear


# ------------------------------------------------------------------ parallel state
def layout_body(tp: int, pp: int) -> dict:
    ps.initialize_model_parallel(tp, pp)
    return {
        "tp": (ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_size(), ps.get_tensor_model_parallel_group(as_list=True), ps.get_tensor_model_parallel_src_rank()),
        "dp": (ps.get_data_parallel_rank(), ps.get_data_parallel_size(), ps.get_data_parallel_group(as_list=True), ps.get_data_parallel_src_rank()),
        "pp": (ps.get_pipeline_model_parallel_rank(), ps.get_pipeline_model_parallel_size(), ps.get_pipeline_model_parallel_group(as_list=True)),
        "next_prev": (ps.get_pipeline_model_parallel_next_rank(), ps.get_pipeline_model_parallel_prev_rank()),
        "stage": (ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage()),
    }


def test_rank_layout_two_ranks(rank_pool):
    pool = rank_pool(2)
    tp2 = pool.run(layout_body, 2, 1)
    assert [r["tp"] for r in tp2] == [(0, 2, [0, 1], 0), (1, 2, [0, 1], 0)]
    assert [r["dp"] for r in tp2] == [(0, 1, [0], 0), (0, 1, [1], 1)]
    dp2 = pool.run(layout_body, 1, 1)
    assert [r["dp"] for r in dp2] == [(0, 2, [0, 1], 0), (1, 2, [0, 1], 0)]
    pp2 = pool.run(layout_body, 1, 2)
    assert [r["pp"] for r in pp2] == [(0, 2, [0, 1]), (1, 2, [0, 1])]
    assert [r["next_prev"] for r in pp2] == [(1, 1), (0, 0)]
    assert [r["stage"] for r in pp2] == [(True, False), (False, True)]


def bad_size_body(tp: int, pp: int) -> str:
    try:
        nxd.neuronx_distributed_config(tensor_parallel_size=tp, pipeline_parallel_size=pp)
    except ValueError as exc:
        return str(exc)
    return "no error"


def test_world_size_must_divide(rank_pool):
    for message in rank_pool(2).run(bad_size_body, 4, 1):
        assert "world size 2 is not divisible" in message and "tensor_model_parallel_size (4)" in message


def test_layer_size_must_divide_tp(rank_pool):
    for message in rank_pool(2).run(bad_layer_body):
        assert "output_size 7 is not divisible by tensor parallel size 2" in message


def bad_layer_body() -> str:
    ps.initialize_model_parallel(2)
    try:
        ColumnParallelLinear(4, 7)
    except ValueError as exc:
        return str(exc)
    return "no error"


# ------------------------------------------------------------------ RNG tracker
def rng_body() -> dict:
    ps.initialize_model_parallel(2)
    model_parallel_manual_seed(42)
    outside = torch.rand(4)
    tracker = get_rng_tracker()
    saved = tracker.get_states()
    with tracker.fork():
        inside = torch.rand(4)
    tracker.set_states(saved)
    with tracker.fork():
        again = torch.rand(4)
    return {"outside": outside, "inside": inside, "again": again, "after": torch.rand(4)}


def test_rng_tracker_differs_across_tp_only_inside_fork(rank_pool):
    r0, r1 = rank_pool(2).run(rng_body)
    assert torch.equal(r0["outside"], r1["outside"]) and torch.equal(r0["after"], r1["after"])
    assert not torch.equal(r0["inside"], r1["inside"])
    assert torch.equal(r0["inside"], r0["again"])  # set_states restores the fork's stream
    # forking does not disturb the default stream
    model_parallel_manual_seed(42)
    expected = torch.rand(4)
    assert torch.equal(r0["outside"], expected) and torch.equal(r0["after"], torch.rand(4))


# ------------------------------------------------------------------ activation checkpointing
class DropBlock(nn.Module):
    calls = 0

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        DropBlock.calls += 1
        with get_rng_tracker().fork():
            x = F.dropout(self.lin(x), p=0.5, training=True)
        return F.dropout(torch.tanh(x), p=0.3, training=True)


class Net(nn.Module):
    nxd_transformer_layer_classes = (DropBlock,)

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(DropBlock(), DropBlock())
        self.head = nn.Linear(6, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x)).sum()


def _grads(checkpoint: bool) -> tuple[list[torch.Tensor], int]:
    torch.manual_seed(0)
    net = Net()
    if checkpoint:
        assert apply_activation_checkpointing(net, Net.nxd_transformer_layer_classes) == 2
    model_parallel_manual_seed(7)
    DropBlock.calls = 0
    net(torch.randn(5, 6)).backward()
    return [p.grad.clone() for p in net.parameters()], DropBlock.calls


def test_activation_checkpointing_recomputes_with_same_dropout():
    plain, plain_calls = _grads(False)
    ckpt, ckpt_calls = _grads(True)
    assert plain_calls == 2 and ckpt_calls == 4  # each block ran again in backward
    for a, b in zip(plain, ckpt):
        assert torch.equal(a, b)


def test_activation_checkpointing_keeps_names_and_survives_deepcopy():
    import copy

    torch.manual_seed(0)
    net = Net()
    names = [n for n, _ in net.named_parameters()]
    apply_activation_checkpointing(net, [DropBlock])
    assert [n for n, _ in net.named_parameters()] == names
    clone = copy.deepcopy(net)
    with torch.no_grad():
        clone.head.weight.zero_()
        clone.head.bias.zero_()
    model_parallel_manual_seed(1)
    with torch.no_grad():
        assert float(clone(torch.randn(2, 6))) == 0.0


def test_activation_checkpoint_config_full_needs_layer_classes():
    cfg = nxd.neuronx_distributed_config(activation_checkpoint_config="full")
    with pytest.raises(ValueError, match="nxd_transformer_layer_classes"):
        nxd.initialize_parallel_model(cfg, lambda: nn.Sequential(nn.Linear(2, 2)))
    model = nxd.initialize_parallel_model(cfg, Net)
    assert all(getattr(b, "_nxd_activation_checkpointed", False) for b in model.local_module().blocks)


# ------------------------------------------------------------------ model init and wrappers
class TPNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.col = ColumnParallelLinear(4, 8, gather_output=False)
        self.row = RowParallelLinear(8, 4, input_is_parallel=True)

    def forward(self, x: torch.Tensor, y: torch.Tensor):
        return F.mse_loss(self.row(self.col(x)), y)


def _reset(module: nn.Module) -> None:
    if hasattr(module, "reset_parameters"):
        module.reset_parameters()


def test_meta_device_init_materialises_and_keeps_shard_attributes():
    def build() -> TPNet:
        torch.manual_seed(3)
        return TPNet()

    meta_cfg = nxd.neuronx_distributed_config(model_init_config={"meta_device_init": True, "param_init_fn": _reset})
    torch.manual_seed(3)
    meta = nxd.initialize_parallel_model(meta_cfg, TPNet)
    eager = nxd.initialize_parallel_model(nxd.neuronx_distributed_config(), build)
    for (name, p), (_, q) in zip(meta.named_parameters(), eager.named_parameters()):
        assert not p.is_meta and torch.equal(p, q), name
    assert meta.local_module().col.weight.tensor_model_parallel and meta.local_module().row.weight.partition_dim == 1


def test_nxd_model_and_optimizer_wrappers():
    cfg = nxd.neuronx_distributed_config(optimizer_config={"zero_one_enabled": False, "grad_clipping": True,
                                                           "max_grad_norm": 0.01})
    torch.manual_seed(0)
    model = nxd.initialize_parallel_model(cfg, TPNet)
    assert isinstance(model, NxDModel) and isinstance(model.local_module(), TPNet)
    assert [n for n, _ in model.named_parameters()] == ["col.weight", "col.bias", "row.weight", "row.bias"]
    assert set(model.state_dict()) == {"col.weight", "col.bias", "row.weight", "row.bias"}
    assert model.col is model.local_module().col  # attributes reach the wrapped module
    opt = nxd.initialize_parallel_optimizer(cfg, torch.optim.SGD, model.parameters(), lr=0.1)
    assert isinstance(opt, NxDOptimizer) and isinstance(opt, torch.optim.Optimizer)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5 ** step)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    before = model.col.weight.detach().clone()
    loss = model.run_train(x, y)
    assert loss.requires_grad is False and model.col.weight.grad is not None
    opt.step()
    sched.step()
    assert float(opt.grad_norm) > 0.01  # clipping was applied: the update is lr * 0.01 at most
    assert float((model.col.weight.detach() - before).norm()) <= 0.1 * 0.01 + 1e-6
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)
    opt.zero_grad()
    assert model.col.weight.grad is None


def waves_body(tmp: str, factor: int) -> list[float]:
    rank = dist.get_rank()
    marks: list[float] = []

    def work() -> None:
        marks.append(time.monotonic())
        time.sleep(0.3)
        Path(tmp, f"done{rank}").write_text("x")
        marks.append(time.monotonic())

    os.environ["LOCAL_RANK"], os.environ["LOCAL_WORLD_SIZE"] = str(rank), "2"
    run_in_waves(work, factor)
    return marks


def test_sequential_move_factor_bounds_concurrency(rank_pool, tmp_path):
    (tmp_path / "one").mkdir()
    (s0, e0), (s1, e1) = rank_pool(2).run(waves_body, str(tmp_path / "one"), 1)
    assert s1 >= e0  # factor 1: rank 1 starts after rank 0 finished
    (tmp_path / "two").mkdir()
    (s0, e0), (s1, e1) = rank_pool(2).run(waves_body, str(tmp_path / "two"), 2)
    assert s1 < e0 and s0 < e1  # factor 2: both at once


# ------------------------------------------------------------------ backends
def test_backends_registered_and_selected(monkeypatch):
    assert {"cpu", "cuda", "xla"} <= set(nxd.list_components("backend"))
    monkeypatch.delenv("NXD_BACKEND", raising=False)
    assert backends.current_backend().name == "cpu" and backends.get_device() == torch.device("cpu")
    assert backends.current_backend().process_group_backend == "gloo"
    monkeypatch.setenv("NXD_BACKEND", "tpu")
    with pytest.raises(ValueError, match="NXD_BACKEND='tpu'.*cpu.*cuda.*xla"):
        backends.current_backend()
    monkeypatch.setenv("NXD_BACKEND", "xla")
    xla = backends.current_backend()
    assert xla.name == "xla"
    if not xla.is_available():
        with pytest.raises(RuntimeError, match="pip install torch-xla"):
            xla.device()


# 4 ranks last: switching pool sizes restarts the ranks.
@pytest.mark.slow
@pytest.mark.four_ranks
def test_rank_layout_four_ranks(rank_pool):
    # TP contiguous, then DP, then PP outermost.
    res = rank_pool(4).run(layout_body, 2, 2)
    assert [r["tp"][2] for r in res] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [r["pp"][2] for r in res] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert [r["dp"][1] for r in res] == [1] * 4
    res = rank_pool(4).run(layout_body, 2, 1)
    assert [r["dp"][2] for r in res] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert [r["dp"][0] for r in res] == [0, 0, 1, 1]
    # the configured timeout reaches every group of every dimension (singletons and kv_shared too),
    # replaces a context of the same sizes built with another timeout, and survives NxD's config call
    for r in rank_pool(4).run(timeout_body, 4, 1, 7):  # PP=1: nxd-pipeline is not installed here
        # 7 dimensions + the kv_shared groups
        assert r["context"] == 7.0 and r["kept_by_config"] and len(r["groups"]) >= 8, r
        assert all(seconds == 7.0 for seconds in r["groups"]), r


def timeout_body(tp: int, pp: int, seconds: int) -> dict:
    from datetime import timedelta

    ps.initialize_model_parallel(tp, pp, timeout=timedelta(seconds=seconds))
    ctx = nxd.get_parallel_context()
    dims = [ctx.dim(name) for name in nxd.parallel.DIMENSIONS] + list(ctx.kv_shared.values())
    # torch keeps a gloo group's timeout in its backend's options (no public getter)
    groups = [d.group._get_backend(torch.device("cpu")).options._timeout.total_seconds() for d in dims]
    nxd.neuronx_distributed_config(tensor_parallel_size=tp, pipeline_parallel_size=pp)
    return {"context": ctx.timeout.total_seconds(), "groups": groups, "kept_by_config": nxd.get_parallel_context() is ctx}


def context_body(tp: int) -> dict:
    nxd.neuronx_distributed_config(tensor_parallel_size=tp)
    ctx = nxd.get_parallel_context()
    return {
        "sizes": ctx.sizes(), "coords": ctx.coordinates(), "device": str(ctx.device), "backend": ctx.backend.name,
        "timeout": ctx.timeout == nxd.parallel.DEFAULT_TIMEOUT,
        # size-1 dimensions share one singleton group rather than creating one each
        "shared_singletons": ctx.cp.group is ctx.ep.group,
        "facade": (ps.get_context_model_parallel_size(), ps.get_expert_model_parallel_size(),
                   ps.get_expert_data_parallel_group(as_list=True), ps.get_context_model_parallel_group(as_list=True)),
        "current_backend": backends.current_backend() is ctx.backend,
    }


def test_parallel_context_carries_every_dimension(rank_pool, monkeypatch):
    r0, r1 = rank_pool(2).run(context_body, 1)
    assert r0["sizes"] == {"tp": 1, "cp": 1, "dp": 2, "pp": 1, "ep": 1, "edp": 2, "dp_cp": 2}
    assert r1["coords"] == {"tp": 0, "cp": 0, "dp": 1, "pp": 0, "ep": 0, "edp": 1, "dp_cp": 1}
    assert r0["device"] == "cpu" and r0["backend"] == "cpu" and r0["timeout"] and r0["current_backend"]
    assert r0["shared_singletons"]
    assert r0["facade"] == (1, 1, [0, 1], [0]) and r1["facade"] == (1, 1, [0, 1], [1])


# ------------------------------------------------------------------ the step contract
class _TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.out = nn.Embedding(11, 8), nn.Linear(8, 11)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.out(self.emb(input_ids)).flatten(0, 1), labels.flatten())


def test_run_train_with_micro_batches_accumulates_like_a_manual_loop():
    torch.manual_seed(0)
    wrapped, twin = _TinyLM(), _TinyLM()
    twin.load_state_dict(wrapped.state_dict())
    micro = [{"input_ids": torch.randint(0, 11, (2, 5)), "labels": torch.randint(0, 11, (2, 5))} for _ in range(3)]
    loss = NxDModel(wrapped).run_train(*micro)
    expected = torch.zeros(())
    for batch in micro:
        part = twin(**batch)
        (part / 3).backward()
        expected += part.detach() / 3
    assert torch.equal(loss, expected)
    for (name, p), q in zip(wrapped.named_parameters(), twin.parameters()):
        assert torch.equal(p.grad, q.grad), name
    with torch.no_grad():
        assert torch.equal(NxDModel(wrapped).run_eval(*micro), torch.stack([twin(**b) for b in micro]).mean())


def test_run_train_loss_fn_replaces_the_model_loss():
    """A workflow's loss (here: twice the model's) goes through ``loss_fn``; the gradients and the
    returned mean are those of that loss; a pipeline model refuses it (its last stage owns the loss)."""
    torch.manual_seed(0)
    wrapped, twin = _TinyLM(), _TinyLM()
    twin.load_state_dict(wrapped.state_dict())
    model = NxDModel(wrapped)
    micro = [{"input_ids": torch.randint(0, 11, (2, 5)), "labels": torch.randint(0, 11, (2, 5))} for _ in range(2)]
    seen = []

    def doubled(batch):
        seen.append(batch)
        return 2 * model(**batch)

    loss = model.run_train(*micro, loss_fn=doubled)
    assert seen == micro
    expected = sum(2 * twin(**b) / 2 for b in micro)
    expected.backward()
    assert torch.equal(loss, expected.detach())
    for (name, p), q in zip(wrapped.named_parameters(), twin.parameters()):
        assert torch.equal(p.grad, q.grad), name
    assert torch.equal(model.run_eval(*micro, loss_fn=doubled), 2 * torch.stack([twin(**b) for b in micro]).mean())

    class _Pipelined(nn.Module):
        def run_train(self, *micro_batches, autocast=None):
            raise AssertionError("not reached")

    with pytest.raises(ValueError, match="loss_fn is not supported under pipeline parallelism"):
        NxDModel(_Pipelined()).run_train(*micro, loss_fn=doubled)


class _TermsLM(_TinyLM):
    """Reports its loss as two named terms (``loss = ce + 0.5 * reg``), as an MoE model does."""

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict:
        ce = super().forward(input_ids, labels)
        reg = self.out.weight.pow(2).mean()
        return {"loss": ce + 0.5 * reg, "loss_terms": {"ce": ce, "reg": reg}}


def test_run_train_sums_the_outputs_named_loss_terms():
    torch.manual_seed(0)
    model = NxDModel(_TermsLM())
    micro = [{"input_ids": torch.randint(0, 11, (2, 5)), "labels": torch.randint(0, 11, (2, 5))} for _ in range(2)]
    sums: dict = {}
    loss = model.run_train(*micro, loss_terms=sums)
    assert sorted(sums) == ["ce", "reg"] and not any(v.requires_grad for v in sums.values())
    assert torch.allclose((sums["ce"] + 0.5 * sums["reg"]) / 2, loss, rtol=1e-6)
    evaluated: dict = {}
    model.run_eval(*micro, loss_terms=evaluated)
    assert torch.allclose(evaluated["ce"], sums["ce"], rtol=1e-6)


def test_loss_terms_of_reads_an_hf_style_aux_loss_and_refuses_non_scalars():
    from types import SimpleNamespace

    from nxd_core_parallel.loss_terms import loss_terms_of

    aux = torch.tensor(2.0)
    # transformers' MoeCausalLMOutputWithPast is a dict with attributes; its aux_loss is None without
    # output_router_logits
    assert loss_terms_of({"loss": torch.tensor(1.0), "aux_loss": aux}) == {"aux_loss": aux}
    assert loss_terms_of(SimpleNamespace(loss=torch.tensor(1.0), aux_loss=aux)) == {"aux_loss": aux}
    assert loss_terms_of({"loss": torch.tensor(1.0), "aux_loss": None}) == {}
    assert loss_terms_of(torch.tensor(1.0)) == {}
    with pytest.raises(TypeError, match=r"loss_terms\['ce'\] must be a scalar tensor"):
        loss_terms_of({"loss": aux, "loss_terms": {"ce": torch.ones(3)}})
