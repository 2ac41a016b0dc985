"""Optimizer checkpoints of an expert-parallel Mixtral reshard across EP, for the plain optimizer
(NxDOptimizer: expert state gathered over EP into one file) and ZeRO-1 (per-rank shards, expert
state placed in the full experts' layout): train 2 steps at EP=2 and save; load at EP=1, save
again; load at EP=2: the optimizer state is bit-identical to the one saved, and training continued
at EP=1 from the EP=2 checkpoint follows the EP=2 run."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

from nxd.transforms import parallelize_model

sys.path.insert(0, str(Path(__file__).parent))
from mixtral_test_utils import batch, lm_loss, quiet_transformers, save_hf  # noqa: E402

quiet_transformers()

BATCH, TAG = 4, "step2"


def optim_body(ep: int, zero1: bool, hf_dir: str, load_from: str | None, save_to: str | None,
               batches: list[dict[str, torch.Tensor]]) -> dict:
    """Build at EP=``ep``; start from ``hf_dir`` and train 2 steps, or load ``load_from``; save to
    ``save_to``; train 2 more steps. Returns this rank's optimizer state (as saved) and the losses
    of the steps after the save."""
    import json

    import nxd
    from nxd_core_parallel import parallel_state
    from nxd_models_mixtral import MixtralConfig, MixtralForCausalLM, load_hf_checkpoint
    from nxd_testing.reference import train_data_parallel

    cfg = nxd.neuronx_distributed_config(expert_parallel_size=ep, optimizer_config={
        "zero_one_enabled": zero1, "grad_clipping": True, "max_grad_norm": 1.0})
    model = parallelize_model(MixtralForCausalLM(MixtralConfig.from_dict(json.loads((Path(hf_dir) / "config.json").read_text()))))
    opt = nxd.initialize_parallel_optimizer(cfg, torch.optim.AdamW, model.parameters(), lr=1e-2, weight_decay=0.1)
    if load_from is None:
        load_hf_checkpoint(model, hf_dir)
        train_data_parallel(model, opt, batches[:2], group=parallel_state.get_data_parallel_group(), loss_of=lm_loss)
    else:
        nxd.load_checkpoint(load_from, tag=TAG, model=model, optimizer=opt)
    state = copy.deepcopy(opt.state_dict())  # collective for the plain optimizer (gathers experts)
    if save_to is not None:
        nxd.save_checkpoint(save_to, tag=TAG, model=model, optimizer=opt)
    return {"state": state, "losses": train_data_parallel(model, opt, batches[2:], group=parallel_state.get_data_parallel_group(),
                                                      loss_of=lm_loss).losses}


def _equal(a: object, b: object, where: str = "") -> None:
    if torch.is_tensor(a):
        assert torch.is_tensor(b) and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), where
        for k in a:
            _equal(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@pytest.mark.slow
@pytest.mark.parametrize("zero1", [False, True], ids=["plain", "zero1"])
def test_optimizer_state_reshards_ep2_to_ep1_and_back(rank_pool, tmp_path, zero1):
    src = save_hf(tmp_path / "hf", seed=7)
    batches = [batch(seed=200 + s, batch_size=BATCH) for s in range(4)]
    pool = rank_pool(2)
    ck2, ck1 = str(tmp_path / "ck-ep2"), str(tmp_path / "ck-ep1")
    ep2 = pool.run(optim_body, 2, zero1, str(src), None, ck2, batches, timeout=600)
    ep1 = pool.run(optim_body, 1, zero1, str(src), ck2, ck1, batches, timeout=600)
    back = pool.run(optim_body, 2, zero1, str(src), ck1, None, batches, timeout=600)
    for rank in range(2):  # EP=2 -> EP=1 -> EP=2: every rank's state exactly as saved
        _equal(back[rank]["state"], ep2[rank]["state"], f"rank {rank}")
    if not zero1:  # the plain optimizer's state dict holds every expert: the same at both EP degrees
        _equal(ep1[0]["state"], ep2[0]["state"], "EP=1 vs EP=2")
    worst = max(abs(a - b) / abs(b) for a, b in zip(ep1[0]["losses"], ep2[0]["losses"]))
    assert worst < 1e-5, worst
    print(f"\n{'ZeRO-1' if zero1 else 'plain'}: EP=2 -> EP=1 continued losses within {worst:.2g} of EP=2's")
