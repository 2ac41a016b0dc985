"""optimum.neuron.utils.training_utils (nxd-compat stand-in): generation over a TP model."""

from nxd_compat.generation import patch_generation_mixin_to_general_neuron_generation_mixin

__all__ = ["patch_generation_mixin_to_general_neuron_generation_mixin"]
