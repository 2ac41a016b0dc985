"""DP sharding (disjoint, covering the global batch) and exact resume, in-process and on gloo ranks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nxd.errors import ConfigError
from nxd_data.factories import indexed

GBS, MBS, SEQ = 8, 2, 8


def _module(prefix: Path, dp_rank: int = 0, dp: int = 1, seed: int = 5, mbs: int = MBS, gbs: int = GBS):
    config = {"data_prefix": [0.6, str(prefix[0]), 0.4, str(prefix[1])], "splits_string": "1,0,0"}
    return indexed(config, seq_length=SEQ, micro_batch_size=mbs, global_batch_size=gbs, dp_rank=dp_rank, dp_size=dp, seed=seed)


@pytest.fixture
def prefixes(tmp_path: Path, marked_dataset) -> tuple[Path, Path]:
    # small datasets so a few steps cross epoch boundaries
    return marked_dataset(tmp_path / "a", 12, base=100), marked_dataset(tmp_path / "b", 8, base=200, seed=1)


def _step_rows(dm, steps: int) -> list[list[tuple[int, ...]]]:
    it = dm.train_batches()
    per_step = dm.global_batch_size // (dm.micro_batch_size * dm.dp_size)
    return [[tuple(r.tolist()) for _ in range(per_step) for r in next(it)["input_ids"]] for _ in range(steps)]


@pytest.mark.parametrize("dp", [2, 4])
def test_dp_ranks_are_disjoint_and_cover_the_global_batch(prefixes, dp: int) -> None:
    reference = _step_rows(_module(prefixes), 6)  # one rank sees the whole global batch
    ranks = [_module(prefixes, r, dp) for r in range(dp)]
    indices = [[dm.rank_indices(c) for c in range(0, GBS, MBS * dp)] for dm in ranks]
    flat = sorted(i for per_rank in indices for chunk in per_rank for i in chunk)
    assert flat == list(range(GBS))  # disjoint and complete for the first global batch
    per_rank = [_step_rows(dm, 6) for dm in ranks]
    for step in range(6):
        assert sorted(row for rows in per_rank for row in rows[step]) == sorted(reference[step])


def test_resume_equals_uninterrupted_stream(prefixes) -> None:
    full = _module(prefixes, dp_rank=1, dp=2)
    it = full.train_batches()
    for _ in range(7):
        next(it)
    state = full.state_dict()
    rest = [next(it) for _ in range(9)]  # crosses several epochs of the small datasets
    assert state["consumed_samples"] == 7 * MBS * 2
    resumed = _module(prefixes, dp_rank=1, dp=2)
    resumed.load_state_dict(state)
    again = resumed.train_batches()
    for want in rest:
        got = next(again)
        assert got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k]) for k in want)


def test_resume_with_other_dp_size_continues_the_global_stream(prefixes) -> None:
    two = [_module(prefixes, r, 2) for r in range(2)]
    its = [dm.train_batches() for dm in two]
    for it in its:
        for _ in range(4):  # one global batch = 2 micro-batches per rank; take two steps
            next(it)
    one = _module(prefixes)
    one.load_state_dict(two[0].state_dict())
    reference = _step_rows(_module(prefixes), 3)[2]
    assert sorted(_step_rows(one, 1)[0]) == sorted(reference)


def test_state_mismatch_is_an_error(prefixes) -> None:
    dm = _module(prefixes)
    with pytest.raises(ConfigError, match="seed=6 but this run uses seed=5"):
        dm.load_state_dict({"consumed_samples": 4, "seed": 6})
    with pytest.raises(ConfigError, match="consumed_samples=3 is not a multiple"):
        dm.load_state_dict({"consumed_samples": 3})


def _rank_body(a: str, b: str) -> list[list[int]]:
    import torch.distributed as dist

    from nxd_data.factories import indexed as factory

    rank, world = dist.get_rank(), dist.get_world_size()
    config = {"data_prefix": [0.6, a, 0.4, b], "splits_string": "1,0,0"}
    dm = factory(config, seq_length=SEQ, micro_batch_size=MBS, global_batch_size=GBS, dp_rank=rank, dp_size=world, seed=5)
    it = dm.train_batches()
    mine = torch.cat([next(it)["input_ids"] for _ in range(GBS // (MBS * world))])
    gathered = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)  # what a real DP group sees for one global batch
    return torch.cat(gathered).tolist()


@pytest.mark.slow
def test_gloo_ranks_share_one_global_batch(prefixes, rank_pool) -> None:
    results = rank_pool(2).run(_rank_body, str(prefixes[0]), str(prefixes[1]))
    assert results[0] == results[1]
    rows = [tuple(r) for r in results[0]]
    assert len(rows) == GBS
    assert sorted(rows) == sorted(_step_rows(_module(prefixes), 1)[0])
