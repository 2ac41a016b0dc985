"""Which layers the ``fp8`` transform converts and that each converted nxd layer computes exactly
what torchao's own ``Float8Linear`` computes (one process: TP=1, emulated FP8 on CPU)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torchao.float8 import Float8LinearConfig
from torchao.float8.float8_linear import Float8Linear

import nxd
from nxd import ConfigError
from nxd_fp8 import convert_to_fp8, fp8_refusal, parse_options
from nxd_tensor_parallel.modules.qkv_linear import GQAQKVColumnParallelLinear
from nxd_tensor_parallel.parallel_layers import ColumnParallelLinear, RowParallelLinear


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
@pytest.mark.parametrize("layer", ["column", "row"])
def test_parallel_layer_is_torchaos_float8_linear(recipe: str, layer: str) -> None:
    torch.manual_seed(0)
    cls = ColumnParallelLinear if layer == "column" else RowParallelLinear
    ours = cls(32, 48, bias=True)
    plain = torch.nn.Linear(32, 48)
    plain.weight, plain.bias = ours.weight, ours.bias  # the same parameters
    config = dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), emulate=True)
    theirs = Float8Linear.from_float(plain, config)
    convert_to_fp8(ours, parse_options({"recipe": recipe, "emulate": True}))
    x = torch.randn(4, 8, 32, requires_grad=True)
    got, want = ours(x), theirs(x)
    assert torch.equal(got, want)
    g = torch.randn_like(got)
    got_grads = torch.autograd.grad(got, (x, ours.weight, ours.bias), g)
    want_grads = torch.autograd.grad(want, (x, theirs.weight, theirs.bias), g)
    for a, b in zip(got_grads, want_grads):
        assert torch.equal(a, b)
    assert not torch.equal(got, torch.nn.functional.linear(x, ours.weight, ours.bias))  # FP8 rounding acts


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = GQAQKVColumnParallelLinear(32, [32, 16], bias=False)
        self.up = ColumnParallelLinear(32, 64, bias=False)
        self.down = RowParallelLinear(64, 32, bias=False)
        self.plain = torch.nn.Linear(32, 32)
        self.odd = torch.nn.Linear(32, 10)
        self.lm_head = ColumnParallelLinear(32, 64, bias=False)


def test_which_layers_are_converted() -> None:
    model, report = convert_to_fp8(Tiny(), parse_options({"emulate": True}))
    assert report.converted == ["qkv", "up", "down", "plain"]
    assert report.skipped == {"odd": "weight shard (10, 32) has a dimension not divisible by 16",
                              "lm_head": "named in skip_modules (kept in high precision)"}
    assert [type(getattr(model, n)).__name__ for n in ("qkv", "up", "down", "plain", "odd", "lm_head")] == [
        "Float8GQAQKVColumnParallelLinear", "Float8ColumnParallelLinear", "Float8RowParallelLinear", "Float8Linear",
        "Linear", "ColumnParallelLinear"]
    # parameters, their names and checkpoints are unchanged: the conversion swaps classes only
    assert list(model.state_dict()) == list(Tiny().state_dict())
    _, again = convert_to_fp8(model, parse_options({"emulate": True, "skip_modules": []}))
    assert again.converted == ["lm_head"]  # converted layers are left alone; the head on request


def test_options_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"unknown option\(s\) recipie"):
        parse_options({"recipie": "rowwise"})
    with pytest.raises(ConfigError, match=r"recipe='delayed': torchao's float8 recipes are tensorwise, rowwise"):
        parse_options({"recipe": "delayed"})
    with pytest.raises(ConfigError, match="skip_modules must be a list"):
        parse_options({"skip_modules": "lm_head"})


def test_refused_where_there_is_no_fp8_matmul() -> None:
    assert "this run trains on 'cpu'" in fp8_refusal("cpu", "tensorwise", emulate=False)
    assert "this run trains on 'xla'" in fp8_refusal("xla", "rowwise", emulate=False)
    assert fp8_refusal("cpu", "rowwise", emulate=True) is None
    if not torch.cuda.is_available():
        assert "sees no CUDA device" in fp8_refusal("cuda", "tensorwise", emulate=False)
        # the Python path: the config is refused when it is made, naming the field and the way out
        with pytest.raises(ConfigError, match=r"model_transforms\['fp8'\].*compute capability >= 8.9.*precision\.fp8\.emulate=true"):
            nxd.neuronx_distributed_config(model_transforms={"fp8": {"recipe": "rowwise"}})
    assert nxd.neuronx_distributed_config(model_transforms={"fp8": {"emulate": True}}).transform_options("fp8")


def test_a_model_without_fp8_layers_is_refused() -> None:
    config = nxd.neuronx_distributed_config(model_transforms={"fp8": {"emulate": True}})
    with pytest.raises(ConfigError, match="no linear layer of this model can run in FP8.*odd: weight shard"):
        nxd.initialize_parallel_model(config, lambda: torch.nn.Sequential().add_module("odd", torch.nn.Linear(8, 10))
                                      or torch.nn.ModuleDict({"odd": torch.nn.Linear(8, 10)}))


@pytest.mark.slow  # compiles two blocks (~20 s on 2 cores)
def test_fp8_blocks_compile() -> None:
    """fp8 (order 200) runs before compile (500): the compiled blocks hold FP8 layers, and torchao's
    float8 matmul (``allow_in_graph``) traces; aot_eager keeps the ops, so the loss and gradients are
    bitwise the eager FP8 model's."""
    from fp8_models import batch, build

    def run(compile_config: object) -> tuple[torch.Tensor, list[torch.Tensor]]:
        cfg = nxd.neuronx_distributed_config(model_transforms={"fp8": {"emulate": True}}, compile_config=compile_config)
        model = nxd.initialize_parallel_model(cfg, build)
        blocks = [m for m in model.modules() if type(m).__name__ == "Block"]
        assert all((getattr(b, "_compiled_call_impl", None) is not None) == bool(compile_config) for b in blocks)
        assert all(type(b.up).__name__ == "Float8ColumnParallelLinear" for b in blocks)
        loss = model(*batch(0))
        loss.backward()
        return loss.detach(), [p.grad for p in model.parameters()]

    eager_loss, eager_grads = run(None)
    torch._dynamo.reset()
    loss, grads = run({"backend": "aot_eager"})
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # dynamo did capture the blocks
    assert torch.equal(loss, eager_loss)
    assert all(torch.equal(a, b) for a, b in zip(grads, eager_grads))
