"""LoRA on nn.Conv1d / nn.Conv2d, single process, with PEFT's LoraModel on the same weights as the oracle:
outputs, every gradient (adapters and input), merged weights, and the PEFT file round trip."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from nxd_lora import LoraConfig, LoRAModel, load_adapter, save_adapter
from nxd_lora.peft_format import collect_adapter_state_dict

TOL = 1e-5
RANK, ALPHA = 4, 6.0


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.seq = nn.Conv1d(3, 6, kernel_size=3, stride=2, padding=1)
        self.stem = nn.Conv2d(4, 8, kernel_size=(3, 2), stride=(2, 1), padding=(1, 0))
        self.pointwise = nn.Conv2d(8, 8, kernel_size=1, bias=False)  # PEFT's 1x1 merge branch
        self.grouped = nn.Conv2d(8, 8, kernel_size=3, padding=1, groups=2)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        return self.seq(x1).sum() * 0.1 + self.grouped(torch.tanh(self.pointwise(self.stem(x2)))).square().mean()


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return (torch.randn(2, 3, 9, generator=g).requires_grad_(), torch.randn(2, 4, 7, 5, generator=g).requires_grad_())


def _pair(targets: list[str], **kw) -> tuple[LoRAModel, nn.Module]:
    """Ours and PEFT's on one base, with PEFT's adapter weights set from our (non-zero) export."""
    import peft

    torch.manual_seed(0)
    base = ConvNet()
    ours = LoRAModel(copy.deepcopy(base), LoraConfig(enable_lora=True, lora_rank=RANK, lora_alpha=ALPHA,
                                                     target_modules=targets, **kw))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in ours.lora_layers.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    theirs = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(
        r=RANK, lora_alpha=ALPHA, target_modules=targets, use_rslora=kw.get("use_rslora", False)))
    result = peft.set_peft_model_state_dict(theirs, collect_adapter_state_dict(ours))
    assert not result.unexpected_keys, result.unexpected_keys
    return ours, theirs


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().abs().max() / b.detach().abs().max().clamp_min(1e-12))


@pytest.mark.parametrize("kw", [{}, {"use_rslora": True}])
def test_conv_outputs_and_grads_match_peft(kw):
    ours, theirs = _pair(["seq", "stem", "pointwise", "grouped"], **kw)
    (a1, a2), (b1, b2) = _inputs(), _inputs()
    out, ref = ours(a1, a2), theirs(b1, b2)
    ours.set_adapters_enabled(False)
    assert _rel(out, ours(*_inputs())) > 1e-3  # the (non-zero) adapters change the output
    ours.set_adapters_enabled(True)
    out.backward()
    ref.backward()
    errors = {"output": _rel(out, ref), "input grads": max(_rel(a1.grad, b1.grad), _rel(a2.grad, b2.grad))}
    peft_params = dict(theirs.named_parameters())
    for name, (_, adapter) in ours.adapters().items():
        shapes = {}
        for which in ("lora_A", "lora_B"):
            mine = getattr(adapter.pieces[name], which)
            other = peft_params[f"base_model.model.{name}.{which}.default.weight"]
            assert mine.shape == other.shape, (name, which, mine.shape, other.shape)
            errors[f"{name}.{which} grad"] = _rel(mine.grad, other.grad)
            shapes[which] = tuple(mine.shape)
    print(f"\nLoRA conv vs PEFT {kw}: max rel {max(errors.values()):.2e} {errors}")
    assert max(errors.values()) <= TOL, errors
    assert tuple(ours.lora_layers["grouped"].pieces["grouped"].lora_B.shape) == (8, RANK // 2, 1, 1)


def test_conv_merge_matches_peft_and_unmerges_exactly():
    targets = ["seq", "stem", "pointwise"]
    ours, theirs = _pair(targets)
    x1, x2 = _inputs()
    with torch.no_grad():
        unmerged = ours(x1, x2)
        before = {k: v.clone() for k, v in ours.module.state_dict().items()}
        ours.merge_lora()
        merged_out = ours(x1, x2)
        peft_merged = theirs.merge_and_unload().state_dict()
    errors = {name: _rel(ours.module.state_dict()[f"{name}.weight"], peft_merged[f"{name}.weight"]) for name in targets}
    errors["merged output"] = _rel(merged_out, unmerged)
    print(f"\nLoRA conv merge vs PEFT: {errors}")
    assert max(errors.values()) <= TOL, errors
    ours.unmerge_lora()
    assert all(torch.equal(v, before[k]) for k, v in ours.module.state_dict().items())


def test_conv_adapter_file_round_trip(tmp_path):
    ours, _ = _pair(["stem", "grouped"])
    save_adapter(ours, tmp_path)
    torch.manual_seed(0)
    again = LoRAModel(ConvNet(), LoraConfig(enable_lora=True, lora_rank=RANK, lora_alpha=ALPHA,
                                            target_modules=["stem", "grouped"]))
    load_adapter(again, tmp_path)
    with torch.no_grad():
        assert torch.equal(again(*_inputs()), ours(*_inputs()))
    with pytest.raises(ValueError, match="grouped convolution"):
        again.merge_lora()


@pytest.mark.parametrize("conv, message", [
    (nn.Conv2d(4, 4, 3, dilation=2), "dilation"),
    (nn.Conv1d(4, 4, 3, padding=1, padding_mode="reflect"), "padding_mode"),
    (nn.Conv2d(6, 6, 1, groups=3), "divisible by groups"),
])
def test_conv_settings_peft_cannot_describe_are_refused(conv, message):
    with pytest.raises(ValueError, match=message):
        LoRAModel(nn.Sequential(conv), LoraConfig(enable_lora=True, lora_rank=RANK, lora_alpha=ALPHA,
                                                  target_modules=["0"]))
