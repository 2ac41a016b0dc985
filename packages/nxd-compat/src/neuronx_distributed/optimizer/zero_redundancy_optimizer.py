"""``neuronx_distributed.optimizer.zero_redundancy_optimizer``: where NxD defines ``NeuronZero1Optimizer`` (nxd-zero1's).

The class is nxd-zero1's own, so ``mock.patch.object`` / ``mock.patch`` of its methods through this
path (``...zero_redundancy_optimizer.NeuronZero1Optimizer.step``) changes the optimizer every nxd
path builds. NxD's module-level getters (``model_parallel_is_initialized``,
``get_data_parallel_replica_groups``) are not here: nxd-zero1 takes its groups from the parallel
context, so patching them here could change nothing (docs/migration.md).
"""

from nxd_zero1 import NeuronZero1Optimizer

__all__ = ["NeuronZero1Optimizer"]
