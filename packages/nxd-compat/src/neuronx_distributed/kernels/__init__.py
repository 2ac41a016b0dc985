"""``neuronx_distributed.kernels``: NxD's NKI kernels. Their math runs on torch here."""
