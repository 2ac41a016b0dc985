"""Checkpoints of an expert-parallel Mixtral hold every expert, so they load at another EP degree:
saved at EP=2 (2 ranks) and loaded at EP=1, and the reverse, the weights equal the source exactly."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from nxd.transforms import parallelize_model

sys.path.insert(0, str(Path(__file__).parent))
from mixtral_test_utils import quiet_transformers, save_hf  # noqa: E402

quiet_transformers()


def ckpt_body(ep: int, hf_dir: str | None, ckpt_dir: str, action: str) -> dict | None:
    """``save``: import ``hf_dir`` at EP=``ep`` and save; ``load``: load the checkpoint at EP=``ep``
    and return the HF-named state dict (rank 0)."""
    import json

    import torch.distributed as dist

    import nxd
    from nxd_core_parallel import parallel_state
    from nxd_models_mixtral import MixtralConfig, MixtralForCausalLM, collect_hf_state_dict, load_hf_checkpoint

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, expert_model_parallel_size=ep)
    config = MixtralConfig.from_dict(json.loads((Path(ckpt_dir) / "config.json").read_text()))
    model = parallelize_model(MixtralForCausalLM(config))
    if action == "save":
        load_hf_checkpoint(model, hf_dir)
        nxd.save_checkpoint(ckpt_dir, tag="step1", model=model)
        return None
    nxd.load_checkpoint(ckpt_dir, tag="step1", model=model)
    state = collect_hf_state_dict(model)
    return state if dist.get_rank() == 0 else None


def _source(hf_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(hf_dir / "model.safetensors"))


def test_save_ep2_load_ep1_and_save_ep1_load_ep2(rank_pool, tmp_path):
    src = save_hf(tmp_path / "hf")
    expected = _source(src)
    pool = rank_pool(2)
    for save_ep, load_ep in ((2, 1), (1, 2)):
        ckpt = tmp_path / f"ckpt-ep{save_ep}"
        ckpt.mkdir()
        (ckpt / "config.json").write_text((src / "config.json").read_text())
        pool.run(ckpt_body, save_ep, str(src), str(ckpt), "save", timeout=600)
        loaded = pool.run(ckpt_body, load_ep, None, str(ckpt), "load", timeout=600)[0]
        assert set(loaded) == set(expected)
        for key, tensor in expected.items():
            assert torch.equal(loaded[key], tensor), f"EP={save_ep} -> EP={load_ep}: {key} differs"
