"""QLoRA: a LoRA target's frozen base weight stored as NF4 (torchao's ``NF4Tensor``).

The base ``nn.Linear`` keeps its class and parameter name; only ``weight`` becomes an
``NF4Tensor`` (4-bit codes in blocks of 64 with double-quantised scales, scaler blocks of 256, as
torchao's and torchtune's defaults). ``F.linear`` on an ``NF4Tensor`` dispatches to torchao's
``linear_nf4``, which dequantises per call, so the base's own forward is unchanged and the LoRA hook
adds the adapter as for any plain ``nn.Linear``. Adapters stay in the base's compute dtype and train.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from nxd.errors import ConfigError

QUANTIZE_MODES = ("nf4",)
NF4_BLOCK_SIZE = 64
NF4_SCALER_BLOCK_SIZE = 256
#: NF4 needs whole scaler blocks of whole blocks: numel divisible by 64 * 256
NF4_NUMEL_MULTIPLE = NF4_BLOCK_SIZE * NF4_SCALER_BLOCK_SIZE
KEY = "LoraConfig.quantize_base"


def _torchao_nf4() -> Any:
    try:
        from torchao.quantization.quantize_.workflows.nf4 import nf4_tensor
    except ImportError:
        raise ConfigError(f"{KEY}='nf4' needs torchao (NF4Tensor): pip install 'nxd-lora[qlora]'") from None
    return nf4_tensor


def is_nf4(weight: Any) -> bool:
    nf4 = _torchao_nf4()
    return isinstance(weight, nf4.NF4Tensor)


def check_nf4_target(name: str, base: nn.Module) -> None:
    """Refuse, naming the key, the layers NF4 cannot store: only plain ``nn.Linear`` on one device."""
    what = f"{name} ({type(base).__name__})"
    if type(base) is not nn.Linear:
        raise ConfigError(f"{KEY}='nf4': LoRA target {what} is not a plain nn.Linear; QLoRA quantises plain "
                          "nn.Linear bases only (tensor-parallel layers are not supported yet): leave it out of "
                          "target_modules or drop quantize_base")
    weight = base.weight
    if type(weight) is not nn.Parameter:
        raise ConfigError(f"{KEY}='nf4': {what}.weight is a {type(weight).__name__} (sharded or already quantised); "
                          "QLoRA needs a plain unsharded weight (FSDP/TP composition is not supported yet)")
    if weight.is_meta:
        raise ConfigError(f"{KEY}='nf4': {what}.weight is on the meta device; load the base weights before LoRA")
    if not weight.dtype.is_floating_point:
        raise ConfigError(f"{KEY}='nf4': {what}.weight has dtype {weight.dtype}; NF4 quantises float weights")
    if weight.numel() % NF4_NUMEL_MULTIPLE:
        raise ConfigError(f"{KEY}='nf4': {what}.weight has shape {tuple(weight.shape)} ({weight.numel()} elements); "
                          f"NF4 (block {NF4_BLOCK_SIZE}, scaler block {NF4_SCALER_BLOCK_SIZE}) needs a multiple of "
                          f"{NF4_NUMEL_MULTIPLE}: leave it out of target_modules or drop quantize_base")


@torch.no_grad()
def quantize_linear_nf4(base: nn.Linear) -> None:
    """Replace ``base.weight`` by a frozen ``NF4Tensor`` of the same values (rounded to NF4)."""
    nf4 = _torchao_nf4()
    weight = nf4.to_nf4(base.weight.detach().contiguous(), NF4_BLOCK_SIZE, NF4_SCALER_BLOCK_SIZE)
    base.weight = nn.Parameter(weight, requires_grad=False)


def nf4_bytes(weight: Any) -> int:
    """Bytes an ``NF4Tensor`` holds: packed codes, quantised scales, their factors and mean."""
    return sum(t.numel() * t.element_size() for t in
               (weight.quantized_data, weight.quantized_scalers, weight.quantization_factor, weight.scaler_mean))
