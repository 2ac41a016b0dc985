"""``neuronx_distributed.modules.moe.expert_mlps``: NxD's ``ExpertMLPs`` constructor and parameters
over nxd-moe's experts (SwiGLU, TP-sharded intermediate, split over expert-parallel ranks).

The parameters are NxD's, named and shaped as NxD's ``Experts`` holds them, so NxD's checkpoints
and converters (``examples/training/{mixtral,dbrx}/convert_checkpoints.py``) read and write them:

* ``mlp_op.gate_up_proj.weight`` ``[E_local, H, 2*I/tp]``: this TP rank's gate columns, then its
  up columns (NxD's ``ExpertFusedColumnParallelLinear(stride=2)``)
* ``mlp_op.down_proj.weight`` ``[E_local, I/tp, H]`` (``ExpertFusedRowParallelLinear``)

nxd-moe's ``ExpertMLPs`` computes with transposed views of them. At EP > 1 a state dict holds all
experts (gathered over the EP group, as nxd-moe's do: a checkpoint loads at any EP degree, and it
is NxD's EP=1 layout); a state dict of this rank's experts (one NxD EP rank's file) loads as is."""

from typing import Any

import torch

from nxd_compat.optional import require

require("nxd_moe", "neuronx_distributed.modules.moe.expert_mlps", "nxd-moe")

import nxd_moe  # noqa: E402
from neuronx_distributed.modules.moe.model_utils import GLUType  # noqa: E402
from nxd.parallel import current_parallel_context  # noqa: E402
from nxd_compat.surface import NotProvidedError  # noqa: E402
from nxd_core_parallel import parallel_state  # noqa: E402
from nxd_moe.groups import expert_parallel_groups  # noqa: E402
from nxd_tensor_parallel.parallel_layers.layers import shard_of  # noqa: E402

__all__ = ["ExpertMLPs"]

#: parameter attributes nxd-core-parallel's grad sync, clipping, ZeRO-1 and nxd-ckpt read
_PARALLEL_ATTRIBUTES = ("expert_model_parallel", "expert_model_parallel_group", "expert_data_parallel_group",
                        "tensor_model_parallel", "partition_stride", "fused_splits")


class ExpertFusedWeight(torch.nn.Module):
    """One of NxD's expert-fused linear layers' ``weight`` (dimension 0: this rank's experts)."""

    def __init__(self, like: torch.nn.Parameter, num_experts: int, first_expert: int, ep_size: int,
                 ep_group: Any, device: torch.device | None) -> None:
        super().__init__()
        # NxD's layout is nxd-moe's with the last two dimensions swapped
        self.weight = torch.nn.Parameter(torch.empty(like.shape[0], like.shape[2], like.shape[1], dtype=like.dtype,
                                                     device=device))
        for name in _PARALLEL_ATTRIBUTES:
            if hasattr(like, name):
                setattr(self.weight, name, getattr(like, name))
        if hasattr(like, "partition_dim"):
            self.weight.partition_dim = 3 - like.partition_dim
        self.num_experts, self.first_expert, self.ep_size, self._ep_group = num_experts, first_expert, ep_size, ep_group

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.ep_size > 1:
            destination[prefix + "weight"] = nxd_moe.gather_experts(self.weight, self.ep_size, self._ep_group)

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any, **kwargs: Any) -> None:
        if self.ep_size > 1 and prefix + "weight" in state_dict:
            state_dict[prefix + "weight"] = nxd_moe.local_experts(state_dict[prefix + "weight"], self.weight,
                                                                  self.first_expert, self.num_experts)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


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
                 expert_model_parallel_group: Any = None, expert_distribution: Any = None,
                 **kernel_options: Any) -> None:
        super().__init__()
        unsupported = {"hidden_act": hidden_act not in ("silu", "swish"), "glu_mlp": not glu_mlp, "bias": bias,
                       "return_bias": return_bias, "hidden_act_scaling_factor": hidden_act_scaling_factor != 1.0,
                       "hidden_act_bias": hidden_act_bias != 0.0,
                       "gate_clamp_upper_limit": gate_clamp_upper_limit is not None,
                       "gate_clamp_lower_limit": gate_clamp_lower_limit is not None,
                       "up_clamp_upper_limit": up_clamp_upper_limit is not None,
                       "up_clamp_lower_limit": up_clamp_lower_limit is not None,
                       "expert_distribution": expert_distribution is not None,
                       # Llama4's order: tokens scaled by their affinity before the experts, not after
                       "early_expert_affinity_modulation": bool(kernel_options.get("early_expert_affinity_modulation")),
                       # NxD's SWIGLU is gate * act(gate) * up; nxd-moe computes act(gate) * up (NxD's GLU)
                       "glu_type": GLUType.validate(glu_type)
                       != GLUType.GLU}
        given = {**kernel_options, **locals()}
        for name, refused in unsupported.items():
            if refused:
                raise NotProvidedError(f"neuronx_distributed.modules.moe.ExpertMLPs({name}={given[name]!r}) is not "
                                       "provided by nxd-compat: nxd-moe's experts are bias-free SwiGLU (silu, "
                                       "glu_mlp=True, glu_type GLU), split evenly over the expert-parallel ranks")
        self.num_experts, self.top_k = num_experts, top_k
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.capacity_factor, self.normalize_top_k_affinities = capacity_factor, normalize_top_k_affinities
        self.sequence_parallel_enabled, self.return_bias = sequence_parallel_enabled, return_bias
        context = current_parallel_context()  # NxD's signature: built for the current context
        groups = expert_parallel_groups(context)
        # nxd-moe's experts compute; built empty (meta) and split as NxD's are at construction (the
        # expert-parallel plan's split), their weights are views of NxD's parameters
        experts = nxd_moe.split_experts(nxd_moe.ExpertMLPs(num_experts, hidden_size, intermediate_size, dtype=dtype,
                                                           device="meta"), context)
        self.mlp_op = torch.nn.Module()
        for name in ("gate_up_proj", "down_proj"):
            setattr(self.mlp_op, name, ExpertFusedWeight(experts._parameters.pop(name), num_experts,
                                                         experts.first_local_expert, groups.ep_size, groups.ep_group,
                                                         device))
        object.__setattr__(self, "_experts", experts)  # not a submodule: its weights are the two above
        if not self.mlp_op.gate_up_proj.weight.is_meta:
            self.reset_parameters(init_method, output_layer_init_method)

    @property
    def experts(self) -> nxd_moe.ExpertMLPs:
        """nxd-moe's experts over this module's parameters (views in nxd-moe's layout: gate_up
        ``[E_local, 2I/tp, H]``, down ``[E_local, H, I/tp]``), refreshed on each access."""
        self._experts.gate_up_proj = self.mlp_op.gate_up_proj.weight.transpose(1, 2)
        self._experts.down_proj = self.mlp_op.down_proj.weight.transpose(1, 2)
        return self._experts

    @torch.no_grad()
    def reset_parameters(self, init_method: Any, output_layer_init_method: Any) -> None:
        """NxD's init of its fused expert layers, so one seed gives the same model at every TP and EP
        degree: each layer's full (master) weight ``[E, H, 2I]`` / ``[E, I, H]`` is drawn on the CPU
        one expert at a time (``init_method(master[e])``); this rank keeps its experts and its TP
        shard (gate_up: stride 2, so the rank's gate and up columns; down: its rows). NxD draws only
        the rank's own experts, so its EP ranks start as copies of each other: nxd draws them all."""
        tp, rank = parallel_state.get_tensor_model_parallel_size(), parallel_state.get_tensor_model_parallel_rank()
        e, h, i = self.num_experts, self.hidden_size, self.intermediate_size
        first, count = self._experts.first_local_expert, self._experts.num_local_experts
        default = lambda w: torch.nn.init.kaiming_uniform_(w, a=5 ** 0.5)  # noqa: E731  NxD's init_method=None
        for layer, master_shape, dim, stride, init in ((self.mlp_op.gate_up_proj, (e, h, 2 * i), 2, 2, init_method),
                                                       (self.mlp_op.down_proj, (e, i, h), 1, 1, output_layer_init_method)):
            master = torch.empty(master_shape, dtype=torch.float32)
            for expert in range(e):
                (init or default)(master[expert])
            local = shard_of(master[first:first + count], dim, stride, rank, tp)
            layer.weight.copy_(local.to(layer.weight.dtype))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotProvidedError("neuronx_distributed.modules.moe.ExpertMLPs.forward (NxD's blockwise/all-experts "
                               "paths) is not provided by nxd-compat: call the experts through MoE(router, expert_mlps)")

