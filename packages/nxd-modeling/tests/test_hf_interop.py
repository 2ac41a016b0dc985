"""nxd_modeling.hf_interop: safetensors slice reading, the HF directory writer, name cleaning."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from nxd_modeling.hf_interop import SafetensorsCheckpoint, clean_param_name, gather_shards, write_hf_dir


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
    assert [t.shape for t in gather_shards(param, 2, None)] == [(2, 3), (2, 3)]


def pipeline_gather_body(out_dir: str) -> dict:
    """PP=2 on 2 ranks: each stage contributes its own tensors; a key from both stages is refused.
    Then CP=2: one writer."""
    from nxd_core_parallel import parallel_state
    from nxd_modeling.hf_interop import (
        assembles_stage,
        check_unused,
        gather_pipeline_stages,
        writes_files,
    )

    context = parallel_state.initialize_model_parallel(1, 2)
    stage = context.pp.rank
    merged = gather_pipeline_stages({f"model.layers.{stage}.w": torch.full((2,), float(stage))}, context)
    try:
        gather_pipeline_stages({"model.norm.weight": torch.zeros(1)}, context)
        duplicate = ""
    except RuntimeError as err:
        duplicate = str(err)
    if writes_files(context):
        write_hf_dir(out_dir, {}, {"model.layers.0.w": torch.zeros(1), "model.layers.1.w": torch.zeros(1)})
    torch.distributed.barrier()
    with SafetensorsCheckpoint(out_dir) as ckpt:  # strict: the other stage's read counts
        check_unused(ckpt, {f"model.layers.{stage}.w"}, strict=True, context=context)
    result = {"merged": {k: v.tolist() for k, v in merged.items()}, "duplicate": duplicate,
              "assembles": assembles_stage(context), "writes": writes_files(context)}
    cp = parallel_state.initialize_model_parallel(1, 1, context_parallel_size=2)  # CP ranks hold the same weights
    result["cp_writes"] = writes_files(cp)
    return result


def test_gather_pipeline_stages_on_two_ranks(rank_pool, tmp_path):
    first, second = rank_pool(2).run(pipeline_gather_body, str(tmp_path))
    assert first["merged"] == {"model.layers.0.w": [0.0, 0.0], "model.layers.1.w": [1.0, 1.0]}
    assert second["merged"] == {} and second["duplicate"] == ""  # only pipeline rank 0 merges
    assert "model.norm.weight is exported by pipeline stages 0 and 1" in first["duplicate"]
    assert first["assembles"] and second["assembles"]  # each stage assembles its own tensors
    assert first["writes"] and not second["writes"]
    assert first["cp_writes"] and not second["cp_writes"]  # one writer at CP=2, not one per CP rank


def test_an_export_is_verified_before_use(tmp_path):
    """Issue 43: nxd's HF export records every file's CRC-32 (nxd_checksums.json); a flipped byte or a
    swapped shard is refused naming the file before any tensor of it is used."""
    from nxd_core_parallel.file_checksums import ChecksumError

    write_hf_dir(tmp_path, {"model_type": "x"}, _tensors(), None, 64)
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    a, b = (p.read_bytes() for p in shards)
    data = bytearray(b)
    data[-1] ^= 1
    shards[1].write_bytes(bytes(data))
    with SafetensorsCheckpoint(tmp_path) as ckpt:
        with pytest.raises(ChecksumError, match=rf"{shards[1]}: content checksum mismatch .*nothing was loaded"):
            ckpt.read(_Piece("b.bias", None))
    shards[0].write_bytes(b)
    shards[1].write_bytes(a)
    with SafetensorsCheckpoint(tmp_path) as ckpt:
        with pytest.raises(ChecksumError, match=rf"its content is that of {shards[1]}"):
            ckpt.read(_Piece("a.weight", None))


def test_index_entries_and_damaged_files_are_named(tmp_path):
    """A weight_map entry outside the folder is refused naming it (before: read); a truncated shard of
    a folder from elsewhere (no manifest) names the file, not safetensors' bare message."""
    from nxd.paths import PathEscapeError
    from nxd_core_parallel.file_checksums import MANIFEST
    from nxd_modeling.hf_interop import HfCheckpointError

    outside, folder = tmp_path / "outside.safetensors", tmp_path / "a" / "b"
    write_hf_dir(folder, {"model_type": "x"}, _tensors(), None, 64)
    (folder / MANIFEST).unlink()
    (folder / "model-00001-of-00002.safetensors").rename(outside)
    index = folder / "model.safetensors.index.json"
    index.write_text(index.read_text().replace("model-00001-of-00002", "../../outside"))
    with pytest.raises(PathEscapeError, match=r"weight_map\['a.weight'\]='../../outside.safetensors'"):
        SafetensorsCheckpoint(folder)
    shard = folder / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:20])
    index.write_text(index.read_text().replace("../../outside", "model-00002-of-00002"))
    with SafetensorsCheckpoint(folder) as ckpt:
        with pytest.raises(HfCheckpointError, match=rf"{shard}: not a readable safetensors file .*truncated or damaged"):
            ckpt.read(_Piece("b.bias", None))
