"""``neuronx_distributed.modules.moe.expert_mlps``: NxD's ``ExpertMLPs`` constructor on nxd-moe's
experts (SwiGLU, TP-sharded intermediate, split over expert-parallel ranks). The expert weights
are nxd-moe's (``experts.gate_up_proj`` ``[E_local, 2*I/tp, H]``, ``experts.down_proj``
``[E_local, H, I/tp]``), not NxD's transposed ``mlp_op`` layout. Used through ``MoE``."""

from types import SimpleNamespace
from typing import Any

import torch

from nxd_compat.optional import require

require("nxd_moe", "neuronx_distributed.modules.moe.expert_mlps", "nxd-moe")

import nxd_moe  # noqa: E402
from nxd.parallel import current_parallel_context  # noqa: E402
from nxd_compat.surface import NotProvidedError  # noqa: E402
from nxd_core_parallel import parallel_state  # noqa: E402
from nxd_core_parallel.parallel_layers.layers import shard_of  # noqa: E402
from nxd_moe.groups import expert_parallel_groups  # noqa: E402

__all__ = ["ExpertMLPs"]


class ExpertMLPs(torch.nn.Module):
    """NxD's signature. Supported: SwiGLU experts (``hidden_act="silu"``, ``glu_mlp=True``), no bias,
    ``capacity_factor`` (None: no token dropped), ``normalize_top_k_affinities``, init methods.
    NxD's Neuron kernel and inference options (``block_size``, ``use_torch_block_wise``, the
    ``tkg``/``cte`` groups, ...) are accepted and have no effect."""

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int, hidden_act: str,
                 glu_mlp: bool, capacity_factor: float | None, sequence_parallel_enabled: bool = False,
                 block_size: int | None = None, normalize_top_k_affinities: bool = False, bias: bool = False,
                 glu_type: Any = None, hidden_act_scaling_factor: float = 1.0, hidden_act_bias: float = 0.0,
                 gate_clamp_upper_limit: float | None = None, gate_clamp_lower_limit: float | None = None,
                 up_clamp_upper_limit: float | None = None, up_clamp_lower_limit: float | None = None,
                 return_bias: bool = False, init_method: Any = torch.nn.init.kaiming_uniform_,
                 output_layer_init_method: Any = torch.nn.init.kaiming_uniform_, dtype: torch.dtype = torch.float32,
                 device: torch.device | None = None, tensor_model_parallel_group: Any = None,
                 expert_model_parallel_group: Any = None, **kernel_options: Any) -> None:
        super().__init__()
        unsupported = {"hidden_act": hidden_act not in ("silu", "swish"), "glu_mlp": not glu_mlp, "bias": bias,
                       "return_bias": return_bias, "hidden_act_scaling_factor": hidden_act_scaling_factor != 1.0,
                       "hidden_act_bias": hidden_act_bias != 0.0,
                       "gate_clamp_upper_limit": gate_clamp_upper_limit is not None,
                       "gate_clamp_lower_limit": gate_clamp_lower_limit is not None,
                       "up_clamp_upper_limit": up_clamp_upper_limit is not None,
                       "up_clamp_lower_limit": up_clamp_lower_limit is not None}
        for name, refused in unsupported.items():
            if refused:
                raise NotProvidedError(f"neuronx_distributed.modules.moe.ExpertMLPs({name}={locals()[name]!r}) is not "
                                       "provided by nxd-compat: nxd-moe's experts are bias-free SwiGLU (silu, glu_mlp=True)")
        self.num_experts, self.top_k = num_experts, top_k
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.capacity_factor, self.normalize_top_k_affinities = capacity_factor, normalize_top_k_affinities
        self.sequence_parallel_enabled, self.return_bias = sequence_parallel_enabled, return_bias
        groups = expert_parallel_groups(current_parallel_context())
        with torch.random.fork_rng(devices=[]):  # nxd-moe's own draws are replaced below: they must not
            # advance the RNG that the layers built after this one draw from
            self.experts = nxd_moe.ExpertMLPs(num_experts, hidden_size, intermediate_size,
                                              tp_size=parallel_state.get_tensor_model_parallel_size(),
                                              ep_size=groups.ep_size, ep_rank=groups.ep_rank, ep_group=groups.ep_group,
                                              edp_group=groups.edp_group, dtype=dtype, device=device)
        if not self.experts.gate_up_proj.is_meta:
            _init_as_nxd(self.experts, init_method, output_layer_init_method)

    @property
    def mlp_op(self) -> SimpleNamespace:
        """NxD's ``mlp_op.gate_up_proj.weight`` ``[E_local, H, 2I/tp]`` and ``mlp_op.down_proj.weight``
        ``[E_local, I/tp, H]``: views of nxd-moe's parameters in NxD's layout (in-place edits, such as
        NxD's DBRX example zeroing padded columns, write through to the parameters)."""
        return SimpleNamespace(gate_up_proj=SimpleNamespace(weight=self.experts.gate_up_proj.transpose(1, 2)),
                               down_proj=SimpleNamespace(weight=self.experts.down_proj.transpose(1, 2)))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotProvidedError("neuronx_distributed.modules.moe.ExpertMLPs.forward (NxD's blockwise/all-experts "
                               "paths) is not provided by nxd-compat: call the experts through MoE(router, expert_mlps)")


@torch.no_grad()
def _init_as_nxd(experts: nxd_moe.ExpertMLPs, init_method: Any, output_layer_init_method: Any) -> None:
    """NxD's init of its fused expert layers, so one seed gives the same model at every TP degree:
    each layer's full (master) weight ``[E_local, H, 2I]`` / ``[E_local, I, H]`` is drawn on the CPU
    one expert at a time (``init_method(master[e])``), then this TP rank keeps its shard (gate_up:
    stride 2, so the rank's gate and up columns; down: its rows), stored in nxd-moe's transposed layout."""
    tp, rank = parallel_state.get_tensor_model_parallel_size(), parallel_state.get_tensor_model_parallel_rank()
    e, h, i = experts.num_local_experts, experts.hidden_size, experts.local_intermediate * tp
    default = lambda w: torch.nn.init.kaiming_uniform_(w, a=5 ** 0.5)  # noqa: E731  NxD's init_method=None
    for param, master_shape, dim, stride, init in ((experts.gate_up_proj, (e, h, 2 * i), 2, 2, init_method),
                                                   (experts.down_proj, (e, i, h), 1, 1, output_layer_init_method)):
        master = torch.empty(master_shape, dtype=torch.float32)
        for expert in range(e):
            (init or default)(master[expert])
        param.copy_(shard_of(master, dim, stride, rank, tp).transpose(1, 2).to(param.dtype))
