"""optimum.neuron.utils (nxd-compat stand-in)."""
