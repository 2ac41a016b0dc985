"""``neuronx_distributed.overrides``."""
