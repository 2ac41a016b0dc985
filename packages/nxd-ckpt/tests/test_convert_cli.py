"""``nxd ckpt convert`` / ``inspect`` / ``list``, and the convert-source registry."""

from __future__ import annotations

import json
import os
import sys
import types

import torch
from safetensors.torch import load_file, save_file
from tp_models import ShardedNet, build

import nxd
from nxd.cli import main
from nxd.specs import ModelSpec
from nxd_ckpt.convert import Converter, FullState

SEED = 321
HF_PREFIX = "transformer."


def save_tp2_body(path: str) -> None:
    nxd.save_checkpoint(path, "t", model=build(2, 1, SEED))


def load_tp2_body(path: str) -> list[str]:
    model = build(2, 1, 0)
    nxd.load_checkpoint(path, model=model)
    ref = build(2, 1, SEED).state_dict()
    return [k for k, v in model.state_dict().items() if not torch.equal(v, ref[k])]


def reference_full_state(_: str = "") -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in build(1, 1, SEED).state_dict().items()}


def test_nxd_to_full_to_nxd_reshards_exactly(rank_pool, tmp_path):
    pool = rank_pool(2)
    pool.run(save_tp2_body, str(tmp_path / "tp2"))
    full_file = tmp_path / "full.pt"
    assert main(["ckpt", "convert", "--from", "nxd", "--to", "full", "--input", str(tmp_path / "tp2"),
                 "--output", str(full_file)]) == 0
    full = torch.load(full_file, weights_only=True)
    reference = pool.run(reference_full_state)[0]
    assert full.keys() == reference.keys()
    assert [k for k in full if not torch.equal(full[k], reference[k])] == []
    assert main(["ckpt", "convert", "--from", "full", "--to", "nxd", "--input", str(full_file),
                 "--output", str(tmp_path / "tp1"), "--tag", "full"]) == 0
    assert pool.run(load_tp2_body, str(tmp_path / "tp1")) == [[], []]


# ---------------------------------------------------------------- a model plugin with HF hooks
def _load_hf(model: torch.nn.Module, hf_dir: str) -> None:
    state = load_file(os.path.join(hf_dir, "model.safetensors"))
    model.load_state_dict({k.removeprefix(HF_PREFIX): v for k, v in state.items()})


def _save_hf(model: torch.nn.Module, out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    save_file({HF_PREFIX + k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(out_dir, "model.safetensors"))
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump({"layers": model.num_layers}, f)


def _build(config: dict, nxd_config: dict | None) -> torch.nn.Module:
    model = ShardedNet(layers=config["layers"])
    model.num_layers = config["layers"]
    return model


SPEC = ModelSpec(name="ckpt-test-net", config_from_dict=dict, build=_build, transformer_layer_classes=(),
                 load_hf=_load_hf, save_hf=_save_hf)


def _register_model() -> None:
    if "ckpt-test-net" in nxd.list_components("model"):
        return
    module = types.ModuleType("nxd_ckpt_test_model")
    module.NXD_PLUGIN_API = (3, 3)
    module.nxd_register_models = nxd.hookimpl(lambda registry: registry.add("ckpt-test-net", SPEC))
    module.nxd_register_models.__name__ = "nxd_register_models"
    sys.modules[module.__name__] = module
    nxd.register_plugin(module, name=module.__name__)


def test_hf_round_trip_through_nxd_is_byte_equal(rank_pool, tmp_path):
    _register_model()
    pool = rank_pool(2)
    hf_in = tmp_path / "hf_in"
    hf_in.mkdir()
    save_file({HF_PREFIX + k: v for k, v in pool.run(reference_full_state)[0].items()}, hf_in / "model.safetensors")
    (hf_in / "config.json").write_text(json.dumps({"layers": 2}))
    args = ["--model", "ckpt-test-net", "--tag", "hf"]
    assert main(["ckpt", "convert", "--from", "hf", "--to", "nxd", "--input", str(hf_in), "--output", str(tmp_path / "n"), *args]) == 0
    assert pool.run(load_tp2_body, str(tmp_path / "n")) == [[], []]  # HF weights land on TP=2 ranks
    assert main(["ckpt", "convert", "--from", "nxd", "--to", "hf", "--input", str(tmp_path / "n"), "--output", str(tmp_path / "hf_out"), *args]) == 0
    a, b = load_file(hf_in / "model.safetensors"), load_file(tmp_path / "hf_out" / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(a[k].dtype == b[k].dtype and a[k].numpy().tobytes() == b[k].numpy().tobytes() for k in a)


class FakeConverterPlugin:
    @nxd.hookimpl
    def nxd_register_checkpoint_converters(self, registry):
        registry.add("fake", Converter(read=lambda request: FullState({"w": torch.full((2,), float(request.input))})))


def test_plugins_can_add_a_source(tmp_path):
    nxd.register_plugin(FakeConverterPlugin(), name="fake-converter", distribution="tests")
    assert "fake" in nxd.list_components("checkpoint_converter")
    assert main(["ckpt", "convert", "--from", "fake", "--to", "full", "--input", "3", "--output", str(tmp_path / "o.pt")]) == 0
    assert torch.equal(torch.load(tmp_path / "o.pt", weights_only=True)["w"], torch.full((2,), 3.0))


def test_unknown_kind_is_named(tmp_path, capsys):
    assert main(["ckpt", "convert", "--from", "no-such-kind", "--to", "full", "--input", "x", "--output", "y"]) == 1
    err = capsys.readouterr().err
    assert "'no-such-kind'" in err and "hf" in err and "nxd" in err


def test_inspect_and_list(rank_pool, tmp_path, capsys):
    rank_pool(2).run(save_tp2_body, str(tmp_path))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "checkpoint").write_text("1")
    assert main(["ckpt", "inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "tp=2 pp=1 dp=1 world=2" in out
    assert "layers.0.qkv.weight_qkv" in out and "fused [4, 2, 2]" in out and "kv x2" in out
    assert main(["ckpt", "inspect", str(tmp_path), "--json"]) == 0
    meta = json.loads(capsys.readouterr().out)
    assert meta["tensors"]["layers.0.up.weight"]["shape"] == [32, 8]
    assert meta["tensors"]["layers.0.up.weight"]["sharding"]["stride"] == 2
    assert main(["ckpt", "list", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines() == ["broken\tINCOMPLETE", "t\tcomplete"]
