"""nxd_core_parallel.hf_interop: safetensors slice reading, the HF directory writer, name cleaning."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from nxd_core_parallel.hf_interop import SafetensorsCheckpoint, clean_param_name, gather_shards, write_hf_dir


@dataclass(frozen=True)
class _Piece:
    hf_key: str
    dim: int | None
    index: tuple[int, ...] = ()
    transpose: bool = False


def _tensors() -> dict[str, torch.Tensor]:
    return {"a.weight": torch.arange(24.0).view(6, 4), "b.bias": torch.arange(5.0)}


@pytest.mark.parametrize("max_shard_size", [None, 64])
def test_write_then_read_slices(tmp_path, max_shard_size):
    tensors = _tensors()
    write_hf_dir(tmp_path, {"model_type": "x"}, tensors, torch.bfloat16, max_shard_size)
    assert '"torch_dtype": "bfloat16"' in (tmp_path / "config.json").read_text()
    assert (tmp_path / "model.safetensors.index.json").is_file() == (max_shard_size is not None)
    with SafetensorsCheckpoint(tmp_path, aliases={"b.alias": "b.bias"}) as ckpt:
        assert ckpt.keys() == set(tensors)
        assert ckpt.shape("a.weight") == (6, 4)
        assert torch.equal(ckpt.read(_Piece("b.alias", None)), tensors["b.bias"])
        assert torch.equal(ckpt.read(_Piece("a.weight", 0, (2, 3))), tensors["a.weight"][2:4])
        assert torch.equal(ckpt.read(_Piece("a.weight", 1, (0, 3))), tensors["a.weight"][:, [0, 3]])
        assert torch.equal(ckpt.read(_Piece("a.weight", 0, (1,), transpose=True)), tensors["a.weight"][1:2].t())
        with pytest.raises(KeyError, match="missing from the checkpoint"):
            ckpt.shape("nope")


def test_missing_directory_names_what_was_found(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="pytorch_model.bin"):
        SafetensorsCheckpoint(tmp_path)


def test_clean_param_name_and_replicated_gather():
    assert clean_param_name("module._orig_mod.layers.0._checkpoint_wrapped_module.mlp.weight") == \
        "layers.0.mlp.weight"
    param = torch.ones(2, 3)
    assert [t.shape for t in gather_shards(param, 2)] == [(2, 3), (2, 3)]
