"""``neuronx_distributed.modules.attention``: NxD's attention helpers (``utils``, vendored)."""
