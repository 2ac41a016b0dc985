"""FP8 (torchao's emulation, so on CPU) with tensor parallelism and each data-parallel strategy,
on real gloo ranks.

TP layers: each rank multiplies its shard in FP8 with the shard's own scales, so a TP run is not
bitwise a one-process FP8 run; it is checked against the exact (fp64) product within the error FP8
rounding allows, derived below, and the error is required to be FP8's size (far above fp32's), so a
silently unconverted layer fails too.

Data parallelism: a rank's FP8 casts see only its rows, so the oracle is one process that runs the
DP ranks' halves of each batch as two micro-batches (the same casts on the same rows) and averages
them: DDP, ZeRO-1 and FSDP must match it to fp32 rounding (1e-5 relative over the steps)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from fp8_models import FP8_LAYERS, LR, batch, build

import nxd
from nxd_testing.reference import max_rel, train_data_parallel, train_reference

STEPS = 3
EMULATED = {"emulate": True}


def _errors(dtype: torch.dtype) -> tuple[float, float]:
    """(relative, absolute-per-amax) rounding error of a cast to ``dtype`` with an amax-based scale:
    half an ulp of a normal number, and half the subnormal spacing over the scale (the scale maps amax
    to at most the largest finite value; rowwise rounds it down to a power of two, hence the 2)."""
    f = torch.finfo(dtype)
    return f.eps / 2, 2 * (f.smallest_normal * f.eps / 2) / f.max


def _worst(*dtypes: torch.dtype) -> tuple[float, float]:
    pairs = [_errors(d) for d in dtypes]
    return max(p[0] for p in pairs), max(p[1] for p in pairs)


#: inputs and weights are cast to e4m3 by every recipe; gradients to e5m2 (tensorwise) or e4m3 (rowwise)
FWD = _worst(torch.float8_e4m3fn)
GRAD = _worst(torch.float8_e4m3fn, torch.float8_e5m2)


def matmul_bound(a: torch.Tensor, b: torch.Tensor, ea: tuple[float, float], eb: tuple[float, float]) -> torch.Tensor:
    """Elementwise bound on |fp8(a) @ fp8(b) - a @ b| (fp64): each operand's cast error is at most
    ``u|v| + s * amax(v)``, plus fp32 accumulation over the k products."""
    a, b = a.double(), b.double()
    da = ea[0] * a.abs() + ea[1] * a.abs().max()
    db = eb[0] * b.abs() + eb[1] * b.abs().max()
    k = a.shape[-1]
    return da @ b.abs() + a.abs() @ db + da @ db + k * 2.0 ** -24 * (a.abs() + da) @ (b.abs() + db)


def tp_layer_body(recipe: str) -> dict[str, float]:
    from nxd_fp8 import convert_to_fp8, parse_options
    from nxd_tensor_parallel.parallel_layers import ColumnParallelLinear, RowParallelLinear

    nxd.neuronx_distributed_config(tensor_parallel_size=2)
    ctx = nxd.get_parallel_context()
    out: dict[str, float] = {}
    for kind, cls, kw, dim in (("column", ColumnParallelLinear, {"gather_output": True}, 0),
                               ("row", RowParallelLinear, {"input_is_parallel": False}, 1)):
        torch.manual_seed(7)
        layer = cls(64, 96, bias=False, **kw)
        shards = [torch.empty_like(layer.weight) for _ in range(ctx.tp.size)]
        dist.all_gather(shards, layer.weight.detach().contiguous(), group=ctx.tp.group)
        full = torch.cat(shards, dim=dim)
        convert_to_fp8(layer, parse_options({"recipe": recipe, **EMULATED}))
        assert type(layer).__name__ == f"Float8{cls.__name__}"
        x = torch.randn(4, 8, 64, requires_grad=True)
        g = torch.randn(4, 8, 96)
        y = layer(x)
        dx, dw = torch.autograd.grad(y, (x, layer.weight), g)
        x2, g2 = x.detach().reshape(-1, 64), g.reshape(-1, 96)
        checks = {
            "y": (y.reshape(-1, 96), x2.double() @ full.double().T, matmul_bound(x2, full.T, FWD, FWD)),
            "dx": (dx.reshape(-1, 64), g2.double() @ full.double(), matmul_bound(g2, full, GRAD, FWD)),
            "dw": (dw, (g2.double().T @ x2.double()).chunk(ctx.tp.size, dim)[ctx.tp.rank],
                   matmul_bound(g2.T, x2, GRAD, FWD).chunk(ctx.tp.size, dim)[ctx.tp.rank]),
        }
        for name, (got, exact, bound) in checks.items():
            err = (got.double() - exact).abs()
            assert (err <= bound).all(), (kind, name, (err / bound).max().item())
            # FP8's error, far above fp32's: the matmul did run in FP8
            assert err.max() > 1e-3 * exact.abs().max(), (kind, name, err.max().item())
            out[f"{kind}.{name}"] = (err / bound).max().item()
    return out


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_tp2_layers_within_fp8_rounding_of_exact(rank_pool, recipe: str) -> None:
    results = rank_pool(2).run(tp_layer_body, recipe)
    print(recipe, "worst error / derived bound per rank:", results)


def _fp8_report(model: torch.nn.Module):
    return next(m.fp8_report for m in model.modules() if hasattr(m, "fp8_report"))


def train_body(strategy: str, tp: int = 1, sp: bool = False) -> tuple[list[float], list[str], dict[str, str]]:
    kwargs = {"zero1": {"optimizer_config": {"zero_one_enabled": True}}, "fsdp": {"fsdp_config": True},
              "ddp": {}}[strategy]
    cfg = nxd.neuronx_distributed_config(tensor_parallel_size=tp, sequence_parallel=sp,
                                         model_transforms={"fp8": EMULATED}, **kwargs)
    ctx = nxd.get_parallel_context()
    model = nxd.initialize_parallel_model(cfg, build, False, sp)
    opt = nxd.initialize_parallel_optimizer(cfg, torch.optim.AdamW, model.parameters(), lr=LR)
    report = _fp8_report(model)
    run = train_data_parallel(model, opt, [batch(s) for s in range(STEPS)], group=ctx.dp.group)
    return run.losses, report.converted, report.skipped


def dp_oracle(dp: int = 2) -> list[float]:
    from nxd_fp8 import convert_to_fp8, parse_options

    model, _ = convert_to_fp8(build(), parse_options(EMULATED))

    def halves(m: torch.nn.Module, b: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return sum(m(*(t.chunk(dp)[r] for t in b)) for r in range(dp)) / dp

    return train_reference(model, torch.optim.AdamW(model.parameters(), lr=LR), [batch(s) for s in range(STEPS)],
                           loss_of=halves).losses


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "fsdp"])
def test_dp2_strategies_match_one_process_fp8(rank_pool, strategy: str) -> None:
    want = dp_oracle()
    for losses, converted, skipped in rank_pool(2).run(train_body, strategy):
        assert converted == FP8_LAYERS and list(skipped) == ["lm_head"]
        rel = max_rel(losses, want)
        print(f"{strategy} DP=2 fp8 (emulated) losses {losses} vs one process {want}: max rel {rel:.2e}")
        assert rel < 1e-5


def test_tp2_sequence_parallel_zero1_trains(rank_pool) -> None:
    for losses, converted, _ in rank_pool(2).run(train_body, "zero1", tp=2, sp=True):
        assert converted == FP8_LAYERS
        assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0], losses
