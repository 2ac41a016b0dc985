"""nxd-compat's stand-in for optimum-neuron (put on the path by ``nxd-compat-run`` with the torch_xla
one, only when torch-xla is absent; optimum-neuron itself needs Neuron hardware). It provides what
NxD's scripts call: ``utils.training_utils.patch_generation_mixin_to_general_neuron_generation_mixin``."""

NXD_STAND_IN = True
