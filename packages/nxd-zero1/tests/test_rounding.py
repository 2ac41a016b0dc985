"""stochastic_round_to_bf16: only the two bf16 neighbours come out, and their mean is the input."""

from __future__ import annotations

import math

import pytest
import torch

from nxd_zero1 import stochastic_round_to_bf16

N = 1 << 18  # samples per value: the std of a mean of N roundings is at most ulp / (2 * sqrt(N)) = ulp / 1024


def neighbours(x: float) -> tuple[float, float, float]:
    lo = torch.tensor([x]).to(torch.bfloat16)
    lo_f = float(lo)
    if lo_f > x:  # bf16 cast rounds to nearest; step down to the lower neighbour
        lo_f = float(torch.nextafter(lo, torch.tensor([-math.inf], dtype=torch.bfloat16)))
    hi_f = float(torch.nextafter(torch.tensor([lo_f], dtype=torch.bfloat16), torch.tensor([math.inf], dtype=torch.bfloat16)))
    return lo_f, hi_f, hi_f - lo_f


@pytest.mark.parametrize("x", [1.0 + 0.3 * 2**-7, -1.0 - 0.3 * 2**-7, 3.7e-3 + 0.9 * 2**-16, 1000.5, -2.0 + 0.1 * 2**-6])
def test_unbiased_and_only_neighbours(x):
    lo, hi, ulp = neighbours(x)
    g = torch.Generator().manual_seed(0)
    out = stochastic_round_to_bf16(torch.full((N,), x), g).to(torch.float32)
    assert out.dtype == torch.float32 and set(out.unique().tolist()) <= {lo, hi}
    frac = (x - lo) / ulp  # probability of rounding up
    # 5 standard deviations of the sample mean (binomial): a biased rounding misses by ~frac * ulp.
    tol = 5 * ulp * math.sqrt(frac * (1 - frac) / N)
    mean = float(out.double().mean())
    assert abs(mean - x) <= tol, (mean, x, tol)
    # round-to-nearest would be off by min(frac, 1 - frac) * ulp, far outside the tolerance
    assert min(frac, 1 - frac) * ulp > 20 * tol


def test_mean_error_over_many_values_is_zero():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, generator=g)
    err = stochastic_round_to_bf16(x, g).to(torch.float32).double() - x.double()
    ulp = torch.ldexp(torch.ones(N, dtype=torch.float64), torch.frexp(x).exponent - 8)  # bf16 spacing at |x|
    # each error lies in (-ulp, ulp) with mean 0; averaging N of them (|err| <= ulp, so std <= ulp_max/sqrt(N))
    scaled = err / ulp
    assert scaled.abs().max() < 1.0 + 1e-6
    assert abs(float(scaled.mean())) < 5 / math.sqrt(N)
    nearest = (x.to(torch.bfloat16).double() - x.double()) / ulp
    assert nearest.abs().mean() > 0.2  # sanity: the error being averaged is not trivially zero


def test_representable_values_and_specials_are_exact():
    exact = torch.tensor([0.0, -0.0, 1.0, -2.5, 2**-130, 65280.0, math.inf, -math.inf])
    out = stochastic_round_to_bf16(exact)
    assert torch.equal(out.float(), exact)
    assert torch.isnan(stochastic_round_to_bf16(torch.tensor([math.nan]))).all()


def test_tiny_updates_accumulate_only_with_sr():
    g = torch.Generator().manual_seed(2)
    w_sr = torch.ones(4096, dtype=torch.bfloat16)
    w_rn = torch.ones(4096, dtype=torch.bfloat16)
    step = 2**-7 / 64  # 1/64 of bf16's spacing at 1.0
    for _ in range(256):
        w_sr = stochastic_round_to_bf16(w_sr.float() + step, g)
        w_rn = (w_rn.float() + step).to(torch.bfloat16)
    assert torch.all(w_rn == 1.0)  # round-to-nearest loses every update
    # SR: expected 1 + 256 * step = 1 + 4 ulp; mean over 4096 elements is within ~0.1 ulp
    assert abs(float(w_sr.float().mean()) - (1 + 256 * step)) < 0.25 * 2**-7


def test_generator_makes_it_reproducible_and_rejects_ints():
    x = torch.randn(1000)
    a = stochastic_round_to_bf16(x, torch.Generator().manual_seed(5))
    b = stochastic_round_to_bf16(x, torch.Generator().manual_seed(5))
    assert torch.equal(a, b)
    with pytest.raises(TypeError, match="floating-point"):
        stochastic_round_to_bf16(torch.arange(3))
