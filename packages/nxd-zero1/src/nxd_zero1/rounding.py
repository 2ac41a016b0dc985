"""Software stochastic rounding from fp32 to bf16.

bf16 is the upper 16 bits of an fp32 number. Truncating the lower 16 bits rounds the magnitude
toward zero; adding a uniform random integer in ``[0, 2**16)`` to those bits first makes the
truncation carry into the kept bits with probability equal to the dropped fraction. The result is
therefore an unbiased estimate of ``x``: ``E[round(x)] == x`` (up to fp32 precision), which is what
lets updates far smaller than bf16's spacing still move the weights on average. Because fp32 is
sign-magnitude, the same bit trick is unbiased for negative numbers too.

Non-finite inputs (inf, NaN) are cast with ordinary round-to-nearest so they stay inf/NaN. A finite
value within one bf16 ulp of the largest bf16 number may round up to inf, as carry out of the
exponent field is the mathematically correct stochastic choice there.
"""

from __future__ import annotations

import torch

_LOW_BITS = 16
_KEEP_MASK = -65536  # 0xFFFF0000 as a signed int32


def stochastic_round_to_bf16(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Round ``x`` (fp32; other float dtypes are upcast first) to bf16 stochastically.

    ``generator`` (on ``x``'s device) makes the rounding reproducible; ``None`` uses torch's
    global RNG. Returns a new bf16 tensor with ``x``'s shape.
    """
    if not torch.is_floating_point(x):
        raise TypeError(f"stochastic_round_to_bf16 needs a floating-point tensor, got dtype {x.dtype}")
    x32 = x.detach().to(torch.float32).contiguous()
    noise = torch.randint(0, 1 << _LOW_BITS, x32.shape, dtype=torch.int32, device=x32.device, generator=generator)
    bits = (x32.view(torch.int32) + noise).bitwise_and_(_KEEP_MASK)
    # The kept bits are exactly representable in bf16, so this cast performs no further rounding.
    rounded = bits.view(torch.float32).to(torch.bfloat16)
    finite = torch.isfinite(x32)
    if bool(finite.all()):
        return rounded
    return torch.where(finite, rounded, x32.to(torch.bfloat16))
