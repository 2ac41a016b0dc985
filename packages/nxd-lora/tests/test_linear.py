"""LoRA on plain nn.Linear layers, single process, with PEFT as the oracle."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn

from nxd.errors import ConfigError
from nxd_core_parallel.file_checksums import MANIFEST, ChecksumError
from nxd_lora import LoraConfig, LoRAModel, load_adapter, save_adapter
from nxd_lora.checkpoint import find_adapter_dir, from_pretrained, save_lora_checkpoint

H = 8


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj, self.v_proj, self.o_proj = nn.Linear(H, H), nn.Linear(H, 2 * H), nn.Linear(2 * H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.o_proj(torch.tanh(self.q_proj(x)).repeat(1, 2) * self.v_proj(x))


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(), Block()])
        self.norm = nn.LayerNorm(H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


def _base(seed: int = 0) -> Toy:
    torch.manual_seed(seed)
    return Toy()


def _cfg(**kw) -> LoraConfig:
    return LoraConfig(**{"enable_lora": True, "lora_rank": 2, "lora_alpha": 6.0,
                         "target_modules": ["q_proj", "v_proj", "o_proj"], **kw})


def _randomise(model: LoRAModel, seed: int = 3) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.lora_layers.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().abs().max() / b.detach().abs().max())


def test_fresh_adapter_is_identity_and_only_adapters_get_grads():
    base = _base()
    x = torch.randn(4, H)
    ref = base(x)
    model = LoRAModel(copy.deepcopy(base), _cfg())
    assert torch.equal(model(x), ref)  # B starts at zero
    _randomise(model)
    model(x).square().sum().backward()
    for name, p in model.named_parameters():
        is_lora = name.startswith("lora_layers.")
        assert p.requires_grad == is_lora, name
        assert (p.grad is not None) == is_lora, name
    # q: A 2x8 + B 8x2; v: A 2x8 + B 16x2; o: A 2x16 + B 8x2 -> 112 per block
    trainable, total = model.trainable_parameters()
    assert trainable == 2 * (16 + 16 + 16 + 32 + 32 + 16)
    assert total == trainable + sum(p.numel() for p in base.parameters())


@pytest.mark.parametrize("kw", [{}, {"use_rslora": True}, {"init_lora_weights": "gaussian"}, {"bias": "all"},
                                {"target_modules": r"layers\.1\..*_proj"}])
def test_export_loads_in_peft_with_same_outputs(tmp_path, kw):
    import peft

    base = _base()
    model = LoRAModel(copy.deepcopy(base), _cfg(**kw))
    _randomise(model)
    if kw.get("bias") == "all":
        with torch.no_grad():
            model.module.layers[0].q_proj.bias.add_(1.0)
    x = torch.randn(5, H)
    ours = model(x)
    save_adapter(model, tmp_path)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    known = {f for f in peft.LoraConfig.__dataclass_fields__}
    assert set(config) <= known, set(config) - known
    theirs = peft.PeftModel.from_pretrained(copy.deepcopy(base), str(tmp_path))(x)
    assert _rel(ours, theirs) <= 1e-6


def test_peft_adapter_loads_into_nxd(tmp_path):
    import peft

    base = _base()
    pcfg = peft.LoraConfig(r=3, lora_alpha=5, target_modules=["q_proj", "o_proj"], use_rslora=True)
    pm = peft.get_peft_model(copy.deepcopy(base), pcfg)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5)  # non-zero B: the adapter changes outputs
    pm.save_pretrained(str(tmp_path))
    x = torch.randn(3, H)
    expected = pm(x)
    assert _rel(expected, base(x)) > 1e-3
    ours = from_pretrained(copy.deepcopy(base), tmp_path)
    assert ours.lora_config.lora_rank == 3 and ours.lora_config.use_rslora
    assert _rel(ours(x), expected) <= 1e-6


def test_merge_equals_adapter_and_unmerge_is_exact():
    base = _base()
    model = LoRAModel(copy.deepcopy(base), _cfg())
    _randomise(model)
    x = torch.randn(6, H)
    with_adapter = model(x)
    before = {k: v.clone() for k, v in model.module.state_dict().items()}
    model.merge_lora()
    assert _rel(model(x), with_adapter) <= 1e-6
    w = model.module.layers[0].q_proj.weight
    piece = model.lora_layers["layers__0__q_proj"].pieces["q_proj"]
    assert torch.allclose(w, before["layers.0.q_proj.weight"] + 3.0 * piece.lora_B @ piece.lora_A, atol=1e-6)
    model.unmerge_lora()
    for k, v in model.module.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert torch.equal(model(x), with_adapter)


def test_save_modes(tmp_path):
    base = _base()
    x = torch.randn(2, H)
    for mode, kw in {"adapter": {}, "both": {"save_lora_base": True},
                     "merged": {"save_lora_base": True, "merge_lora": True}}.items():
        model = LoRAModel(copy.deepcopy(base), _cfg(**kw))
        _randomise(model)
        expected = model(x)
        out = save_lora_checkpoint(model, tmp_path, tag=mode)
        has_adapter, has_base = (out / "lora_adapter").is_dir(), (out / "base_model").is_dir()
        assert (has_adapter, has_base) == {"adapter": (True, False), "both": (True, True), "merged": (False, True)}[mode]
        if has_base:
            from safetensors.torch import load_file

            reloaded = _base(seed=99)
            reloaded.load_state_dict(load_file(str(out / "base_model" / "model.safetensors")))
            if mode == "merged":
                assert _rel(reloaded(x), expected) <= 1e-6
            else:
                assert all(torch.equal(a, b) for a, b in zip(reloaded.state_dict().values(),
                                                             base.state_dict().values()))
        if has_adapter:
            again = LoRAModel(copy.deepcopy(base), LoraConfig(
                enable_lora=True, load_lora_from_ckpt=True, lora_save_dir=str(tmp_path), lora_load_tag=mode))
            assert torch.equal(again(x), expected)
            assert find_adapter_dir(tmp_path, mode) == out / "lora_adapter"


def test_bad_adapters_and_targets_are_named(tmp_path):
    base = _base()
    with pytest.raises(ConfigError, match="matched no adaptable layer"):
        LoRAModel(copy.deepcopy(base), _cfg(target_modules=["nope_proj"]))
    with pytest.raises(ConfigError, match="norm"):
        LoRAModel(copy.deepcopy(base), _cfg(target_modules=["norm"]))
    model = LoRAModel(copy.deepcopy(base), _cfg())
    save_adapter(model, tmp_path)
    narrow = LoRAModel(copy.deepcopy(base), _cfg(target_modules=["q_proj"]))
    with pytest.raises(ValueError, match="match no adapter"):
        load_adapter(narrow, tmp_path)
    wide_rank = LoRAModel(copy.deepcopy(base), _cfg(lora_rank=4))
    with pytest.raises(ValueError, match="shape"):
        load_adapter(wide_rank, tmp_path)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    (tmp_path / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    with pytest.raises(ChecksumError, match="adapter_config.json"):  # edited after nxd wrote it
        from_pretrained(copy.deepcopy(base), tmp_path)
    (tmp_path / MANIFEST).unlink()  # without nxd's manifest: an adapter written elsewhere, read as it is
    with pytest.raises(ConfigError, match="use_dora"):
        from_pretrained(copy.deepcopy(base), tmp_path)
    with pytest.raises(FileNotFoundError, match="lora_save_dir"):
        find_adapter_dir(tmp_path / "missing", "t")


def test_initialize_parallel_model_applies_lora_only_when_enabled():
    import nxd
    from nxd_lora.checkpoint import unwrap_lora

    on = nxd.initialize_parallel_model(nxd.neuronx_distributed_config(lora_config=_cfg()), _base)
    lora = unwrap_lora(on)
    assert isinstance(lora, LoRAModel) and len(lora.lora_layers) == 6
    assert sorted(n for n, p in on.named_parameters() if p.requires_grad) == sorted(
        n for n, _ in on.named_parameters() if n.startswith("lora_layers."))
    for off in (None, LoraConfig(enable_lora=False, target_modules=["q_proj"])):
        plain = nxd.initialize_parallel_model(nxd.neuronx_distributed_config(lora_config=off), _base)
        with pytest.raises(TypeError, match="LoRA"):
            unwrap_lora(plain)
        assert all(p.requires_grad for p in plain.parameters())
