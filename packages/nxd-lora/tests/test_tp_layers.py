"""Column/row-parallel LoRA at TP=2 (generic layout, no model spec) against LoRA on nn.Linear in
one process with the same weights: outputs, adapter gradients and the gathered export agree. A
replicated nn.Conv1d stem (never TP-sharded) is adapted too."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from nxd.errors import ConfigError
from nxd_lora import LoraConfig, LoRAModel, collect_adapter_state_dict, save_adapter

CFG = dict(enable_lora=True, lora_rank=2, lora_alpha=4.0, target_modules=["stem", "up", "down"])


class RefToy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv1d(1, 1, 3, padding=1)
        self.up, self.down = nn.Linear(8, 12), nn.Linear(12, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(self.stem(x[:, None])[:, 0])))


def _tp_toy(gather: bool) -> nn.Module:
    from nxd_tensor_parallel.parallel_layers import ColumnParallelLinear, RowParallelLinear

    class TPToy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Conv1d(1, 1, 3, padding=1)
            self.up = ColumnParallelLinear(8, 12, gather_output=gather)
            self.down = RowParallelLinear(12, 8, input_is_parallel=not gather)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.down(torch.relu(self.up(self.stem(x[:, None])[:, 0])))

    return TPToy()


def _grads_as_export(lora: LoRAModel) -> dict[str, torch.Tensor]:
    from nxd_testing.lora_reference import adapter_grads

    return adapter_grads(lora)


def tp_layers_body(state: dict, adapter_dir: str, x: torch.Tensor, gather: bool) -> dict:
    import torch.distributed as dist

    from nxd_core_parallel import parallel_state
    from nxd_lora import load_adapter

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    r = parallel_state.get_tensor_model_parallel_rank()
    model = _tp_toy(gather)
    with torch.no_grad():
        model.stem.load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("stem.")})
        model.up.weight.copy_(state["up.weight"][r * 6:(r + 1) * 6])
        model.up.bias.copy_(state["up.bias"][r * 6:(r + 1) * 6])
        model.down.weight.copy_(state["down.weight"][:, r * 6:(r + 1) * 6])
        model.down.bias.copy_(state["down.bias"])
    lora = LoRAModel(model, LoraConfig(**CFG))
    load_adapter(lora, adapter_dir)
    y = lora(x)
    y.square().sum().backward()
    frozen_clean = all(p.grad is None for p in model.parameters())
    result = {"y": y.detach(), "grads": _grads_as_export(lora), "export": collect_adapter_state_dict(lora),
              "frozen_clean": frozen_clean}
    return result if dist.get_rank() == 0 else None


@pytest.mark.slow
def test_tp2_column_row_lora_matches_single_process(rank_pool, tmp_path):
    torch.manual_seed(0)
    ref = LoRAModel(RefToy(), LoraConfig(**CFG))
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in ref.lora_layers.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    save_adapter(ref, tmp_path)
    state = {k: v.clone() for k, v in ref.module.state_dict().items()}
    x = torch.randn(3, 8, generator=g)
    y = ref(x)
    y.square().sum().backward()
    want_grads, want_export = _grads_as_export(ref), collect_adapter_state_dict(ref)
    worst = 0.0
    for gather in (False, True):
        res = rank_pool(2).run(tp_layers_body, state, str(tmp_path), x, gather)[0]
        assert res["frozen_clean"]
        worst = max(worst, float((res["y"] - y.detach()).abs().max() / y.detach().abs().max()))
        assert set(res["grads"]) == set(want_grads)
        for k in want_grads:
            worst = max(worst, float((res["grads"][k] - want_grads[k]).abs().max() / want_grads[k].abs().max()))
            assert torch.equal(res["export"][k], want_export[k]), k  # load -> export is an exact round trip
    print(f"\nTP=2 column/row LoRA vs single process: worst relative error {worst:.1e}")
    assert worst <= 1e-5


def test_rank_is_reported_and_params_frozen():
    model = LoRAModel(copy.deepcopy(RefToy()), LoraConfig(**CFG))
    assert model.trainable_parameters()[0] == (2 * 1 * 3 + 1 * 2) + (2 * 8 + 12 * 2) + (2 * 12 + 8 * 2)


def padded_target_body() -> str:
    from nxd_core_parallel import parallel_state
    from nxd_tensor_parallel.parallel_layers import ColumnParallelLinear

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    try:
        LoRAModel(nn.Sequential(ColumnParallelLinear(8, 13, pad=True)), LoraConfig(**{**CFG, "target_modules": ["0"]}))
    except ConfigError as err:
        return str(err)
    return "accepted"


def test_padded_target_is_refused(rank_pool):
    assert all("is padded" in m for m in rank_pool(2).run(padded_target_body))
