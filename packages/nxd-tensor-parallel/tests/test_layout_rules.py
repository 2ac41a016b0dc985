"""The layout rules, each decided once (:mod:`nxd_tensor_parallel.layout_rules`): which TP sizes a
model's query/KV heads allow (with and without K/V replication and padding), its vocabulary, and
its sequence under SP (and CP)."""

from __future__ import annotations

import itertools

import pytest

from nxd.errors import ConfigError
from nxd_tensor_parallel.layout_rules import (
    LayoutError,
    SizeNames,
    check_vocab,
    context_chunks,
    head_layout,
    sequence_shard,
)
from nxd_tensor_parallel.modules.kv_heads import head_padding_for, kv_size_multiplier_for

GRID = list(itertools.product(range(1, 13), range(1, 13), (1, 2, 3, 4, 6, 8)))


def _decision(**mode):
    out = {}
    for heads, kv, tp in GRID:
        try:
            out[heads, kv, tp] = head_layout(heads, kv, tp, **mode)
        except LayoutError:
            out[heads, kv, tp] = None
    return out


def test_plain_models_split_whole_query_and_kv_heads() -> None:
    for (heads, kv, tp), layout in _decision(replicate_kv=False).items():
        assert (layout is not None) == (heads % tp == 0 and kv % tp == 0), (heads, kv, tp)
        assert layout is None or (layout.kv_size_multiplier, layout.padding) == (1, None)


def test_replicated_kv_is_the_smallest_multiplier_placing_whole_heads() -> None:
    for (heads, kv, tp), layout in _decision().items():
        assert (layout is not None) == (heads % kv == 0 and heads % tp == 0), (heads, kv, tp)
        if layout is not None:
            assert layout.kv_size_multiplier == kv_size_multiplier_for(heads, kv, tp) and layout.padding is None


def test_padding_covers_query_heads_tp_does_not_divide() -> None:
    for (heads, kv, tp), layout in _decision(pad=True).items():
        assert (layout is not None) == (heads % kv == 0), (heads, kv, tp)
        if layout is not None:
            padding = head_padding_for(heads, kv, tp)
            assert layout.padding == (padding if heads % tp else None)
            assert layout.kv_size_multiplier == padding.kv_size_multiplier(tp)


def test_refusals_name_the_sizes_under_the_callers_names() -> None:
    yaml = SizeNames(tp="distributed_strategy.tensor_model_parallel_size", heads="model num_attention_heads",
                     kv_heads="num_kv_heads")
    with pytest.raises(ConfigError, match=r"^distributed_strategy.tensor_model_parallel_size=2 must divide "
                                          r"model num_attention_heads=3: .* \(why\)$"):
        head_layout(3, 3, 2, names=yaml, hint=" (why)")
    with pytest.raises(LayoutError, match=r"^plan: tensor_parallel_size=4 must divide num_key_value_heads=2"):
        head_layout(8, 2, 4, replicate_kv=False, prefix="plan: ")
    with pytest.raises(LayoutError, match="num_attention_heads=6 must be a multiple of num_key_value_heads=4"):
        head_layout(6, 4, 2, pad=True)


def test_vocab_needs_tp_to_divide_it_unless_the_model_pads_it() -> None:
    check_vocab(64, 4, padded=False)
    check_vocab(63, 4, padded=True)
    with pytest.raises(LayoutError, match=r"^tensor_model_parallel_size=4 must divide model vocab_size=63: "):
        check_vocab(63, 4, padded=False, names=SizeNames(tp="tensor_model_parallel_size", vocab="model vocab_size"))


def test_sequence_parallel_cuts_each_cp_ranks_tokens_over_tp() -> None:
    assert sequence_shard(32, 4) == 8 and sequence_shard(48, 2, cp=4) == 6
    with pytest.raises(LayoutError, match=r"^sp: seq_length=30 must be divisible by tensor_parallel_size=4$"):
        sequence_shard(30, 4, prefix="sp: ")
    with pytest.raises(LayoutError, match=r"context_parallel_size=2 CP ranks' 12 tokens \(of seq_length=24\) must "
                                          r"be divisible by tensor_parallel_size=8"):
        sequence_shard(24, 8, cp=2)


def test_context_parallel_cuts_the_sequence_into_equal_chunks() -> None:
    # every (seq, cp) of a small grid: accepted exactly when 2 x cp (load-balanced) or cp divides seq
    for seq, cp, balanced in itertools.product(range(1, 33), (1, 2, 3, 4, 8), (True, False)):
        parts = cp * (2 if balanced else 1)
        if seq % parts:
            with pytest.raises(LayoutError, match=rf"seq_length={seq} must be divisible by "):
                context_chunks(seq, cp, load_balance=balanced)
        else:
            assert context_chunks(seq, cp, load_balance=balanced) == seq // parts
    with pytest.raises(LayoutError, match=r"^cp: seq_length=30 must be divisible by 2 x context_parallel_size = 4 "
                                          r"\(each CP rank holds two equal chunks of every sequence\)$"):
        context_chunks(30, 2, prefix="cp: ")
