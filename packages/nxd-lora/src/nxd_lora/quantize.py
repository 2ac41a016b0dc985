"""QLoRA: a LoRA target's frozen base weight stored as NF4 (torchao's ``NF4Tensor``).

The base layer keeps its class and parameter name; only its weight becomes an ``NF4Tensor`` (4-bit
codes in blocks of 64 with double-quantised scales, scaler blocks of 256, as torchao's and
torchtune's defaults). Every layer accepted here computes its matmul with ``F.linear`` on that
weight (``nn.Linear``, and nxd's parallel layers through ``LocalLinear.local_linear``), which
dispatches to torchao's ``linear_nf4`` (dequantise per call), so the base's own forward is
unchanged and the LoRA hook adds the adapter as usual. Adapters stay in the base's dtype and train.

The quantised weights are frozen and are left out of the LoRA model's ``state_dict`` (and expected
to be absent by its ``load_state_dict``): a checkpoint holds the adapters and every other tensor,
and the base is quantised again from the same source weights when the run is rebuilt (NF4
quantisation is deterministic), as torchtune's QLoRA recipes do.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from nxd.errors import ConfigError
from nxd_tensor_parallel.modules.plain import Linear as PlainLinear
from nxd_tensor_parallel.modules.qkv_linear import GQAQKVColumnParallelLinear
from nxd_tensor_parallel.parallel_layers.layers import ColumnParallelLinear, RowParallelLinear
from nxd_tensor_parallel.parallel_layers.utils import STORED_BYTES_PER_ELEMENT

QUANTIZE_MODES = ("nf4",)
NF4_BLOCK_SIZE = 64
NF4_SCALER_BLOCK_SIZE = 256
#: NF4 needs whole scaler blocks of whole blocks: numel divisible by 64 * 256
NF4_NUMEL_MULTIPLE = NF4_BLOCK_SIZE * NF4_SCALER_BLOCK_SIZE
KEY = "LoraConfig.quantize_base"
#: the layers whose forward is ``F.linear`` on one weight (exact classes: a subclass, e.g. nxd-fp8's
#: float8 layers, computes its matmul another way) -> the name of that weight
_NF4_LAYERS: dict[type, str] = {nn.Linear: "weight", PlainLinear: "weight", ColumnParallelLinear: "weight",
                                RowParallelLinear: "weight", GQAQKVColumnParallelLinear: "weight_qkv"}


def _torchao_nf4() -> Any:
    try:
        from torchao.quantization.quantize_.workflows.nf4 import nf4_tensor
    except ImportError:
        raise ConfigError(f"{KEY}='nf4' needs torchao (NF4Tensor): pip install 'nxd-lora[qlora]'") from None
    return nf4_tensor


def is_nf4(weight: Any) -> bool:
    """``weight`` (or the local tensor of an FSDP DTensor) is an ``NF4Tensor``."""
    nf4 = _torchao_nf4()
    return isinstance(getattr(weight, "_local_tensor", weight), nf4.NF4Tensor)


def nf4_weight_name(base: nn.Module) -> str:
    """The name of the weight :func:`quantize_nf4` replaces in ``base``."""
    return _NF4_LAYERS[type(base)]


def check_nf4_target(name: str, base: nn.Module, tp: int) -> None:
    """Refuse, naming the key, the layers NF4 cannot store: a layer computing ``F.linear`` on one
    whole (TP=1) float weight of whole NF4 scaler blocks."""
    what = f"{name} ({type(base).__name__})"
    if type(base) not in _NF4_LAYERS:
        raise ConfigError(f"{KEY}='nf4': LoRA target {what} is not a linear layer QLoRA can quantise (nn.Linear, "
                          "nxd's ColumnParallelLinear/RowParallelLinear/GQAQKVColumnParallelLinear): leave it out of "
                          "target_modules or drop quantize_base")
    if tp > 1 and type(base) not in (nn.Linear, PlainLinear):
        raise ConfigError(f"{KEY}='nf4': LoRA target {what} is sharded over tensor_parallel_size={tp}; NF4 over TP "
                          "shards is not supported (each rank would quantise its shard with its own scales, so the "
                          "base would depend on the TP size): use tensor_parallel_size=1 (FSDP or DDP for scale)")
    if isinstance(base, GQAQKVColumnParallelLinear) and not (base.fuse_qkv and base.kv_size_multiplier == 1):
        raise ConfigError(f"{KEY}='nf4': {what} keeps separate or replicated q/k/v weights; QLoRA quantises the "
                          "fused weight_qkv only (fuse_qkv=True, no K/V replication)")
    weight = getattr(base, nf4_weight_name(base))
    wname = f"{what}.{nf4_weight_name(base)}"
    if type(weight) is not nn.Parameter:
        raise ConfigError(f"{KEY}='nf4': {wname} is a {type(weight).__name__} (sharded or already quantised); "
                          "QLoRA quantises a plain weight before data-parallel sharding (FSDP shards the NF4 weight)")
    if not weight.dtype.is_floating_point:
        raise ConfigError(f"{KEY}='nf4': {wname} has dtype {weight.dtype}; NF4 quantises float weights")
    if weight.numel() % NF4_NUMEL_MULTIPLE:
        raise ConfigError(f"{KEY}='nf4': {wname} has shape {tuple(weight.shape)} ({weight.numel()} elements); "
                          f"NF4 (block {NF4_BLOCK_SIZE}, scaler block {NF4_SCALER_BLOCK_SIZE}) needs a multiple of "
                          f"{NF4_NUMEL_MULTIPLE}: leave it out of target_modules or drop quantize_base")


@torch.no_grad()
def quantize_nf4(base: nn.Module) -> str:
    """Replace ``base``'s weight by a frozen ``NF4Tensor`` of the same values (rounded to NF4),
    keeping the weight's attributes (TP sharding tags, fused splits); returns the weight's name.
    On the meta device (``nxd plan``'s and ``--validate``'s builds) only shapes are made."""
    nf4 = _torchao_nf4()
    pname = nf4_weight_name(base)
    old = getattr(base, pname)
    weight = nn.Parameter(nf4.to_nf4(old.detach().contiguous(), NF4_BLOCK_SIZE, NF4_SCALER_BLOCK_SIZE),
                          requires_grad=False)
    for key, value in vars(old).items():
        setattr(weight, key, value)
    setattr(weight, STORED_BYTES_PER_ELEMENT, nf4_bytes(weight) / weight.numel())
    setattr(base, pname, weight)
    return pname


def nf4_bytes(weight: Any) -> int:
    """Bytes an ``NF4Tensor`` holds: packed codes, quantised scales, their factors and mean."""
    weight = getattr(weight, "_local_tensor", weight)
    return sum(t.numel() * t.element_size() for t in
               (weight.quantized_data, weight.quantized_scalers, weight.quantization_factor, weight.scaler_mean))


def check_nf4_shards(model: nn.Module, shards: int, key: str) -> None:
    """FSDP cuts each NF4 weight into ``shards`` row blocks together with its scales
    (torchao's ``aten.split`` on ``NF4Tensor``): every shard must hold whole rows and whole scaler
    blocks. Refuses, naming ``key`` (the setting that shards), a weight that does not cut so."""
    if shards <= 1:
        return
    for name, param in model.named_parameters():
        if not is_nf4(param):
            continue
        rows, blocks = param.shape[0], param.numel() // NF4_NUMEL_MULTIPLE
        if rows % shards or blocks % shards:
            raise ConfigError(f"{KEY}='nf4' with {key}: {name} {tuple(param.shape)} has {blocks} NF4 scaler block(s) "
                              f"of {NF4_NUMEL_MULTIPLE} elements and {rows} rows; FSDP's {shards} shards must each hold "
                              f"whole rows and whole scaler blocks (need both divisible by {shards}): use fewer shards "
                              "(distributed_strategy.fsdp.replicate_degree) or DDP")


@torch.no_grad()
def dequantize_nf4_(module: nn.Module) -> int:
    """Replace every (unsharded) ``NF4Tensor`` weight in ``module`` by a plain frozen parameter of its
    dequantised values: the base a QLoRA adapter was trained against, for saving it in Hugging Face
    format (``spec.save_hf``) and applying the PEFT adapter there. Returns how many were replaced."""
    count = 0
    for sub in module.modules():
        for pname, param in list(sub.named_parameters(recurse=False)):
            if is_nf4(param) and not hasattr(param, "_local_tensor"):  # FSDP's shards: not here
                plain = nn.Parameter(param.get_original_weight(), requires_grad=False)
                for key, value in vars(param).items():
                    if key != STORED_BYTES_PER_ELEMENT:
                        setattr(plain, key, value)
                setattr(sub, pname, plain)
                count += 1
    return count
