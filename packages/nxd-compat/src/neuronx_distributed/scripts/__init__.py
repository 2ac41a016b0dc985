"""``neuronx_distributed.scripts``."""
