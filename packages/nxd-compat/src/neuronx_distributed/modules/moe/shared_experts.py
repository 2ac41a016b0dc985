"""``neuronx_distributed.modules.moe.shared_experts``: NxD's ``SharedExperts`` (dense SwiGLU experts
every token goes through, ``MoE(shared_experts=...)``). Not provided yet: nxd-moe has shared experts
(``nxd_moe.MoELayer(shared_intermediate_size=...)``, nxd's DeepSeek-V3 / Qwen3-MoE families), but
not with NxD's module and parameter layout (``gate_up_proj``/``gate_proj``/``up_proj``/``down_proj``
parallel linears, ``fused_gate_up_projection``, ``transpose_weights``)."""

from nxd_compat.surface import not_provided

_USE = ("nxd_moe.MoELayer(shared_intermediate_size=...) (nxd's deepseek_v3 / qwen3_moe models); "
        "NxD's SharedExperts module layout is not provided")
__getattr__ = not_provided(__name__, {n: _USE for n in (
    "SharedExperts", "ColumnParallelLinearTransposed", "RowParallelLinearTransposed")})
