"""Keys of NxD Training's schema that only configure the Neuron compiler, runtime or NeuronCores.

NxDT turns them into environment variables for neuronx-cc and the Neuron runtime
(``training_orchestrator.process_config``; its schema groups the top-level ones as "Neuron-specific
configurations"). nxd accepts them, so NxDT's configs run unchanged, and says once per key set that
it has no effect here: a note, never silence.

``NO_EFFECT_KEYS`` are the other NxDT keys nxd accepts without acting on them (logging and
instrumentation extras NxDT's configs set): the same one note per key set."""

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


#: key -> what NxD Training does with it that nxd does not
NO_EFFECT_KEYS: dict[str, str] = {
    "exp_manager.log_parameter_norm": "NxD Training logs the parameters' global norm every step; nxd logs the "
                                      "gradient norm (log_gradient_norm) but not the parameter norm",
    "exp_manager.enable_recovery_time_instrumentation": "NxD Training prints a timing breakdown of checkpoint "
                                                        "recovery; nxd's checkpoint metrics rows hold save/load times",
    "exp_manager.save_bf16": "NxD Training saves bf16 copies of the weights; nxd saves the weights in their "
                             "training dtype",
    "trainer.num_sanity_val_steps": "NxD Training (Lightning) runs validation steps before training; nxd does not",
}


def _is_set(value: Any) -> bool:
    return str(value).strip().lower() not in ("none", "false", "0", "")  # NxDT writes some flags as '0'/'1'


def no_effect_notes(config: TrainingConfig) -> list[str]:
    """One note per NO_EFFECT_KEYS key that is set."""
    return [f"{key}={value_at(config, key)!r}: {what}, so it has no effect on this run"
            for key, what in NO_EFFECT_KEYS.items() if _is_set(value_at(config, key))]


def neuron_only_notes(config: TrainingConfig) -> list[str]:
    """One note per Neuron-only key that is set (a value other than null, false or 0)."""
    notes = []
    for key, what in NEURON_ONLY_KEYS.items():
        value: Any = value_at(config, key)
        if _is_set(value):
            notes.append(f"{key}={value!r}: on Neuron, NxD Training sets {what} from it; nxd does not pass "
                         "it on, so it has no effect on this run")
    return notes
