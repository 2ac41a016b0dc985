"""torch-neuronx's ``testing`` (``neuron_allclose``: Neuron device output against the CPU's) needs Neuron."""

from torch_neuronx import needs_neuron

raise needs_neuron("testing")
