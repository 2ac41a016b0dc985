"""``neuronx_distributed.utils.random``: NxD's ``set_random_seed``."""

import random

import torch

from neuronx_distributed.parallel_layers import parallel_state
from neuronx_distributed.parallel_layers.random import model_parallel_xla_manual_seed


def set_random_seed(seed: int) -> None:
    """NxD's: Python's, NumPy's (where installed) and torch's RNGs, then the model-parallel RNG tracker."""
    random.seed(seed)
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        np.random.seed(seed)
    torch.manual_seed(seed)
    if parallel_state.model_parallel_is_initialized():
        model_parallel_xla_manual_seed(seed)
