"""Keys of NxD Training's schema that only configure the Neuron compiler, runtime or NeuronCores.

NxDT turns them into environment variables for neuronx-cc and the Neuron runtime
(``training_orchestrator.process_config``; its schema groups the top-level ones as "Neuron-specific
configurations"). nxd accepts them, so NxDT's configs run unchanged, and says once per key set that
it has no effect here: a note, never silence."""

from __future__ import annotations

from typing import Any

from nxd_training.config.features import value_at
from nxd_training.config.schema import TrainingConfig

#: key -> what it sets on Neuron
NEURON_ONLY_KEYS: dict[str, str] = {
    "compiler_flags": "neuronx-cc's flags (NEURON_CC_FLAGS)",
    "compiler_cache_url": "the Neuron compile cache (NEURON_COMPILE_CACHE_URL)",
    "aync_exec_max_inflight_requests": "the Neuron runtime's queue depth (NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS)",
    "bucket_size_collectives": "the XLA gradient all-reduce bucket size (BUCKET_CAP_MB)",
    "neuron_rt_exec_timeout": "the Neuron runtime's per-execution timeout (NEURON_RT_EXEC_TIMEOUT; nxd's collective "
                              "bound is distributed_strategy.collective_timeout)",
    "neuron_experimental_compress_rg": "compressed replica groups (NEURON_EXPERIMENTAL_COMPRESS_RG)",
    "trainer.lnc": "the logical NeuronCore size (trn2)",
    "model.fusions.softmax": "the Neuron compiler's fused softmax (NEURON_FUSE_SOFTMAX)",
    "precision.xla_use_bf16": "XLA_USE_BF16 (nxd's dtypes come from precision.type)",
    "precision.xla_downcast_bf16": "XLA_DOWNCAST_BF16 (nxd's dtypes come from precision.type)",
    "precision.neuron_rt_stochastic_rounding_en": "the Neuron runtime's stochastic rounding "
                                                  "(NEURON_RT_STOCHASTIC_ROUNDING_EN; nxd's comes from precision.type)",
}


def neuron_only_notes(config: TrainingConfig) -> list[str]:
    """One note per Neuron-only key that is set (a value other than null, false or 0)."""
    notes = []
    for key, what in NEURON_ONLY_KEYS.items():
        value: Any = value_at(config, key)
        if str(value).strip().lower() not in ("none", "false", "0", ""):  # NxDT writes the precision flags as '0'/'1'
            notes.append(f"{key}={value!r}: on Neuron, NxD Training sets {what} from it; nxd does not pass "
                         "it on, so it has no effect on this run")
    return notes
