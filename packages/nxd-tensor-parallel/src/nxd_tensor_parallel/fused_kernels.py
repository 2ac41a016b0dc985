"""Optional fused GPU kernels, selected per op (``model.fused_kernels`` in the YAML, a model
config's ``fused_kernels``): Liger-Kernel's Triton ops for RMSNorm, SwiGLU, RoPE and the fused
linear + cross-entropy that never materialises the ``[tokens, vocab]`` logits.

Each op computes what the eager op of the model computes (Liger's ``llama`` casting mode is
nxd's RMSNorm arithmetic); the choice only changes speed and memory. They run on CUDA tensors
only: a run that selects one is refused before launch on another accelerator, and a forward on
CPU tensors raises naming the op."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from nxd.errors import ConfigError

#: the ops a model may fuse, in the YAML's spelling
FUSED_KERNEL_OPS = ("rms_norm", "swiglu", "rope", "cross_entropy")
INSTALL_HINT = "pip install liger-kernel (Triton kernels: a CUDA GPU)"


def liger_available() -> bool:
    try:
        import liger_kernel.transformers.functional  # noqa: F401
    except ImportError:
        return False
    return True


def validate_fused_kernels(ops: Iterable[str] | None, where: str = "fused_kernels") -> tuple[str, ...]:
    """The selected ops as a tuple; an unknown name, or any op without Liger-Kernel installed, is a
    ConfigError naming ``where``."""
    if ops is None:
        return ()
    if isinstance(ops, str):
        ops = [ops]
    selected = tuple(dict.fromkeys(str(op) for op in ops))
    unknown = [op for op in selected if op not in FUSED_KERNEL_OPS]
    if unknown:
        raise ConfigError(f"{where}: unknown op(s) {unknown}; valid: {list(FUSED_KERNEL_OPS)}")
    if selected and not liger_available():
        raise ConfigError(f"{where}: {list(selected)} need Liger-Kernel, which is not installed: {INSTALL_HINT}")
    return selected


def _functional(op: str, *tensors: torch.Tensor) -> Any:
    bad = next((t for t in tensors if t.device.type != "cuda"), None)
    if bad is not None:
        raise RuntimeError(f"fused kernel {op!r} (Liger-Kernel, Triton) runs on CUDA tensors only, got a tensor "
                           f"on {bad.device}; remove {op!r} from fused_kernels for this device")
    import liger_kernel.transformers.functional as liger

    return liger


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * (x / rms(x))`` with the normalisation in fp32 and cast back before the weight."""
    return _functional("rms_norm", x, weight).liger_rms_norm(x, weight, eps, casting_mode="llama", in_place=False)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` in one pass (the intermediate activation is recomputed in backward)."""
    return _functional("swiglu", gate, up).liger_swiglu(gate, up)


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``q`` ``[b, heads, s, d]`` and ``k`` ``[b, kv_heads, s, d]`` by ``cos``/``sin``
    ``[b, s, d]`` (Hugging Face's half-split layout)."""
    return _functional("rope", q, k, cos, sin).liger_rope(q, k, cos, sin)


def linear_cross_entropy_sum(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                             ignore_index: int = -100) -> torch.Tensor:
    """``sum`` over tokens of ``cross_entropy(hidden @ weight.T, targets)`` (``ignore_index``
    tokens count zero), computed in chunks so the logits never exist whole; fp32 accumulation."""
    liger = _functional("cross_entropy", hidden, weight, targets)
    return liger.liger_fused_linear_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), weight, targets.reshape(-1),
                                                  ignore_index=ignore_index, reduction="sum")
