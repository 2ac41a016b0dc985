"""Which linear layers run in FP8: nn.Linear through torchao's ``convert_to_float8_training``,
nxd's tensor-parallel layers through their FP8 twins (``nxd_fp8.layers``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torchao.float8 import convert_to_float8_training
from torchao.float8.float8_linear import Float8Linear

from nxd_fp8.layers import FLOAT8_CLASSES, Float8LocalLinear, local_weights, to_float8, torchao_config
from nxd_fp8.options import Fp8Options
from nxd_tensor_parallel.parallel_layers import LocalLinear

#: FP8 GEMMs (torch._scaled_mm) need both dimensions of each operand divisible by 16 (torchtitan's rule)
GEMM_MULTIPLE = 16


@dataclass
class Fp8Report:
    """What a conversion did: the converted modules and each skipped one with its reason."""

    converted: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def convert_to_fp8(model: torch.nn.Module, options: Fp8Options) -> tuple[torch.nn.Module, Fp8Report]:
    """Convert every eligible linear layer of ``model`` (in place where possible) and report which."""
    config = torchao_config(options)
    report = Fp8Report()

    def eligible(fqn: str, shapes: list[torch.Size]) -> bool:
        if fqn.rsplit(".", 1)[-1] in options.skip_modules:
            report.skipped[fqn] = "named in skip_modules (kept in high precision)"
            return False
        odd = [tuple(s) for s in shapes if any(d % GEMM_MULTIPLE for d in s)]
        if odd:
            report.skipped[fqn] = f"weight shard {odd[0]} has a dimension not divisible by {GEMM_MULTIPLE}"
            return False
        report.converted.append(fqn)
        return True

    for fqn, module in list(model.named_modules()):
        if not isinstance(module, LocalLinear) or isinstance(module, Float8LocalLinear):
            continue
        if type(module) not in FLOAT8_CLASSES:
            report.skipped[fqn] = f"{type(module).__name__} is a subclass nxd-fp8 has no FP8 twin for"
        elif eligible(fqn, [w.shape for w in local_weights(module)]):
            to_float8(module, config)
    model = convert_to_float8_training(
        model, config=config,
        module_filter_fn=lambda m, fqn: not isinstance(m, Float8Linear) and eligible(fqn, [m.weight.shape]))
    return model, report
