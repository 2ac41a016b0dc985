"""NxD's ``neuronx_distributed.trainer.optimizer``."""

from nxd_compat.surface import not_provided

__getattr__ = not_provided(__name__, {
    "NxDOptimizer": "initialize_parallel_optimizer returns nxd's optimizer wrapper (its class depends on the "
                    "strategy: ZeRO-1, gradient clipping, grad reduction); construct it through "
                    "neuronx_distributed.trainer.initialize_parallel_optimizer"})
