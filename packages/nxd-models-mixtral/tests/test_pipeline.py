"""Mixtral at PP=2 on 2 gloo ranks (1f1b, interleaved_1f1b with 2 chunks per rank, zero_bubble,
1f1b with full activation checkpointing) against the same model at PP=1 with gradient accumulation
(see mixtral_pipeline_utils)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from mixtral_pipeline_utils import check, check_export, export_body, pp_body  # noqa: E402


@pytest.mark.parametrize("schedule, virtual, checkpointing", [("1f1b", 1, False), ("interleaved_1f1b", 2, False),
                                                             ("zero_bubble", 1, False), ("1f1b", 1, True)])
def test_mixtral_pp2_matches_pp1(rank_pool, schedule, virtual, checkpointing):
    per_rank = rank_pool(2).run(pp_body, 1, False, schedule, virtual, checkpointing=checkpointing)
    check(per_rank, f"PP=2 {schedule} (virtual {virtual}{', activation checkpointing' if checkpointing else ''})")


def test_mixtral_pp2_hf_export_matches_pp1(rank_pool, tmp_path):
    """interleaved_1f1b with 2 chunks: each rank owns non-adjacent layers (0 and 2, 1 and 3); after
    one step the PP=2 export equals the PP=1 export of the merged weights (see export_body)."""
    first, second = rank_pool(2).run(export_body, str(tmp_path), [(2, 1, 1, 2, True)])
    assert second == {}  # not the writer
    check_export(first)
