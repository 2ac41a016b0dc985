"""``neuronx_distributed.modules.moe.token_shuffling``: NxD's random token shuffle across DP ranks
before routing (``MoE(token_shuffle_group_size>1)``). Not provided: nxd-moe routes each rank's own tokens."""

from nxd_compat.surface import not_provided

_USE = "MoE(token_shuffle_group_size=1), nxd-moe routes each rank's own tokens"
__getattr__ = not_provided(__name__, {n: _USE for n in (
    "token_shuffle", "token_unshuffle", "all_to_all_for_shuffle", "_all_to_all_for_token_shuffle",
    "_AllToAllForTokenShuffle")})
