"""Which tensor-parallel sizes a model allows, each rule decided in one function: the attention
heads (:func:`head_layout`), the vocabulary (:func:`check_vocab`), the sequence under SP
(:func:`sequence_shard`) and under CP (:func:`context_chunks`).

The pre-launch check (nxd-training's plan), the plan on each rank (:mod:`nxd_tensor_parallel.tensor_plan`)
and the families (Llama's K/V replication and padding, DeepSeek's MLA heads, the transformers
path's layout check) all call :func:`head_layout` (and the pre-launch check and the plan :func:`check_vocab`), so a layout accepted before launch is the one the
ranks build. A refusal is a :class:`LayoutError` whose message names the sizes under the names the
caller passes (:class:`SizeNames`: the model's fields on a rank, the YAML keys before launch).
The arithmetic of where heads sit is :mod:`nxd_tensor_parallel.modules.kv_heads`.
"""

from __future__ import annotations

from dataclasses import dataclass

from nxd.errors import ConfigError
from nxd_tensor_parallel.modules.kv_heads import HeadPadding, head_padding_for, kv_size_multiplier_for


class LayoutError(ConfigError):
    """A parallel layout the model's sizes do not split into; the message names the sizes."""


@dataclass(frozen=True)
class SizeNames:
    """How a refusal names the sizes (e.g. ``"distributed_strategy.tensor_model_parallel_size"``
    before launch, ``"tensor_parallel_size"`` on a rank)."""

    tp: str = "tensor_parallel_size"
    heads: str = "num_attention_heads"
    kv_heads: str = "num_key_value_heads"
    vocab: str = "vocab_size"
    seq: str = "seq_length"
    cp: str = "context_parallel_size"


@dataclass(frozen=True)
class HeadLayout:
    """How attention heads sit over TP: ``kv_size_multiplier`` (NxD's K/V replication; 1 without
    it) and ``padding`` (the padded heads when TP does not divide the query heads, else None)."""

    num_heads: int
    num_kv_heads: int
    tp: int
    kv_size_multiplier: int
    padding: HeadPadding | None


def head_layout(num_heads: int, num_kv_heads: int | None, tp: int, *, replicate_kv: bool = True,
                pad: bool = False, names: SizeNames = SizeNames(), prefix: str = "", hint: str = "") -> HeadLayout:
    """The layout of ``num_heads`` query heads over ``num_kv_heads`` K/V heads (None: MHA) at TP
    size ``tp``, or :class:`LayoutError`.

    * Query heads are sharded whole: TP must divide them, unless ``pad`` (NxD's ``pad_model``: zero
      query heads inside the KV groups and/or zero groups, :func:`~nxd_tensor_parallel.modules.kv_heads.head_padding_for`).
    * ``replicate_kv`` (nxd's families, NxD's ``kv_size_multiplier``): K/V heads TP does not divide
      are replicated so every rank holds the KV heads its query heads use
      (:func:`~nxd_tensor_parallel.modules.kv_heads.kv_size_multiplier_for`); the query heads must be
      grouped evenly over the KV heads. Without it (a plain or transformers model), TP must divide
      the K/V heads too.

    ``prefix``/``hint`` go before/after the message (what is being built, what to do)."""
    kv = num_kv_heads or num_heads

    def refuse(message: str) -> LayoutError:
        return LayoutError(f"{prefix}{message}{hint}")

    grouped = replicate_kv or pad
    if grouped and num_heads % kv:
        raise refuse(f"{names.heads}={num_heads} must be a multiple of {names.kv_heads}={kv} (each K/V head serves "
                     "the same number of query heads)")
    if num_heads % tp:
        if not pad:
            raise refuse(f"{names.tp}={tp} must divide {names.heads}={num_heads}: attention is sharded by whole heads")
        padding = head_padding_for(num_heads, kv, tp)
        return HeadLayout(num_heads, kv, tp, padding.kv_size_multiplier(tp), padding)
    if not grouped:
        if kv % tp:
            raise refuse(f"{names.tp}={tp} must divide {names.kv_heads}={kv}: attention is sharded by whole heads "
                         "and this model does not replicate K/V heads")
        return HeadLayout(num_heads, kv, tp, 1, None)
    m = kv_size_multiplier_for(num_heads, kv, tp)
    assert m is not None  # TP divides the query heads, grouped evenly: m = tp always places them
    return HeadLayout(num_heads, kv, tp, m, None)


def check_vocab(vocab_size: int, tp: int, *, padded: bool, names: SizeNames = SizeNames(), prefix: str = "",
                hint: str = "") -> None:
    """The vocabulary-parallel embedding and LM head shard the vocabulary by rows: TP must divide
    it, unless the model pads it (:mod:`nxd_tensor_parallel.vocab_padding`, ``pad=True``);
    :class:`LayoutError` otherwise."""
    if not padded and vocab_size % tp:
        raise LayoutError(f"{prefix}{names.tp}={tp} must divide {names.vocab}={vocab_size}: the vocabulary-parallel "
                          f"embedding shards it by rows{hint}")


def sequence_shard(seq_length: int, tp: int, cp: int = 1, *, names: SizeNames = SizeNames(), prefix: str = "") -> int:
    """Tokens each rank holds under sequence parallelism: each CP rank's ``seq_length / cp`` tokens
    are cut over TP, so TP must divide them; :class:`LayoutError` otherwise."""
    tokens = seq_length // cp
    if tokens % tp:
        where = (f"each of the {names.cp}={cp} CP ranks' {tokens} tokens (of {names.seq}={seq_length})" if cp > 1
                 else f"{names.seq}={seq_length}")
        raise LayoutError(f"{prefix}{where} must be divisible by {names.tp}={tp}")
    return tokens // tp


def context_chunks(seq_length: int, cp: int, *, load_balance: bool = True, names: SizeNames = SizeNames(),
                   prefix: str = "", hint: str = "") -> int:
    """Tokens in each of the equal chunks context parallelism cuts a sequence into: ``2 x cp`` chunks
    with ``load_balance`` (each CP rank holds two), else ``cp``; :class:`LayoutError` when they do not
    divide the sequence. The pre-launch check and nxd-context-parallel's batch split both ask here."""
    per_rank = 2 if load_balance else 1
    parts = cp * per_rank
    if seq_length % parts:
        rule = f"2 x {names.cp} = {parts}" if load_balance else f"{names.cp} = {parts}"
        raise LayoutError(f"{prefix}{names.seq}={seq_length} must be divisible by {rule} (each CP rank holds "
                          f"{'two equal chunks' if load_balance else 'one equal chunk'} of every sequence){hint}")
    return seq_length // parts
