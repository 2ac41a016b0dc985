"""Mixtral's pipeline compositions on 4 gloo ranks against the same model at PP=1 with gradient
accumulation (see mixtral_pipeline_utils): PP=2 x EP=2 (DP=2), and PP=2 x TP=2 with sequence
parallelism (the layout of NxDT's Mixtral configs). This file sorts between the other 4-rank tests
(test_expert_parallel.py's last, test_expert_parallel_zero1.py), so they share one rank pool."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from mixtral_pipeline_utils import check, check_export, export_body, pp_body, pp_ep_body  # noqa: E402


@pytest.mark.slow  # 4 ranks; 2 layers, 2 micro-batches
def test_mixtral_pp2_tp2_sequence_parallel_matches_pp1(rank_pool):
    check(rank_pool(4).run(pp_body, 2, True, "1f1b", layers=2, count=2), "PP=2 x TP=2 + SP 1f1b")


@pytest.mark.slow  # 4 ranks
def test_mixtral_pp2_ep2_matches_pp1(rank_pool):
    check(rank_pool(4).run(pp_ep_body), "PP=2 x EP=2 (DP=2) 1f1b")


@pytest.mark.slow  # 4 ranks
def test_mixtral_hf_export_pp2_tp2_pp2_ep2_and_pp4(rank_pool, tmp_path):
    """PP=2 x TP=2, PP=2 x EP=2 (DP=2) and PP=4 import the PP=1 folder (strict) and export it again
    bit for bit: each stage's TP rank 0 of DP rank 0 assembles its TP/EP shards, global rank 0
    receives the other stages one at a time and writes."""
    layouts = [(2, 2, 1, 1, False), (2, 1, 2, 1, False), (4, 1, 1, 1, False)]
    per_rank = rank_pool(4).run(export_body, str(tmp_path), layouts, 4)
    assert per_rank[1:] == [{}, {}, {}]
    check_export(per_rank[0])
