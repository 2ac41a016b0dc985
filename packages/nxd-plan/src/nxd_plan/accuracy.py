"""The plan against measurement: small CPU runs of ``nxd train``'s loop whose steady-state peak
is measured by the trainer itself (``trainer.profile.profile_memory``: the bytes of live tensors
when the profiled step starts plus the CPU allocator's high-water mark during it), beside the
plan of the same config. Used by the tests and by benchmarks/bench_plan.py."""

from __future__ import annotations

import copy
from typing import Any

#: layout variants of :func:`measurable_config` (2 ranks each), merged onto its sections
VARIANTS: dict[str, dict[str, Any]] = {
    "dp2": {},
    "tp2": {"distributed_strategy": {"tensor_model_parallel_size": 2}},
    "tp2_sp": {"distributed_strategy": {"tensor_model_parallel_size": 2, "sequence_parallel": True}},
    "zero1_dp2": {"distributed_strategy": {"zero1": True}},
    "zero1_bf16_master": {"distributed_strategy": {"zero1": True}, "precision": {"type": "mixed_precision"}},
    "pp2_1f1b": {"distributed_strategy": {"pipeline_model_parallel_size": 2}, "data": {"global_batch_size": 8}},
    "cp2_zero1": {"distributed_strategy": {"context_parallel_size": 2, "zero1": True}},
    "fsdp_dp2": {"distributed_strategy": {"fsdp": True}},
    "tp2_full_recompute": {"distributed_strategy": {"tensor_model_parallel_size": 2},
                           "model": {"activations_checkpoint_granularity": "full"}},
}


#: a tiny Mixtral (NxDT's dropless ``model.moe`` section, 4 experts, top-2) on :func:`measurable_config`'s
#: run: EP=1 (routed rows exact) and EP=2 (the plan holds the worst case, every choice on one rank)
MOE_VARIANTS: dict[str, dict[str, Any]] = {
    f"moe_ep{ep}": {
        "distributed_strategy": {"expert_model_parallel_size": ep},
        "model": {"architecture": "mixtral", "ffn_hidden_size": 512,
                  "moe": {"num_experts": 4, "top_k": 2, "dropless": True, "capacity_factor": 0.0,
                          "routing_algorithm": "top_k", "output_router_logits": True, "router_aux_loss_coef": 0.02,
                          "normalize_top_k_affinities": True}},
    } for ep in (1, 2)
}


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) \
            else copy.deepcopy(value)
    return out


def measurable_config(corpus: dict[str, str], exp_dir: str, world: int = 2, **sections: Any) -> dict[str, Any]:
    """A 4-layer Llama (hidden 256, sequence 256, micro-batch 2) on ``world`` CPU ranks whose third
    step is profiled with memory (steps 1-2 allocate the optimizer state and buffers)."""
    base = {
        "name": "plan-accuracy", "seed": 7,
        "trainer": {"devices": world, "max_steps": 3, "log_every_n_steps": 1, "val_check_interval": 0,
                    "limit_val_batches": 0, "enable_progress_bar": False, "accelerator": "cpu",
                    "profile": {"start_step": 3, "num_steps": 1, "profile_memory": True}},
        "exp_manager": {"exp_dir": exp_dir, "create_tensorboard_logger": False, "create_checkpoint_callback": False,
                        "resume_if_exists": False},
        "distributed_strategy": {"tensor_model_parallel_size": 1},
        "data": {"module": "indexed", "data_prefix": corpus["data_prefix"], "tokenizer": corpus["tokenizer"],
                 "micro_batch_size": 2, "global_batch_size": 2 * world, "seq_length": 256, "splits_string": "950,50,0"},
        "model": {"architecture": "llama", "vocab_size": 512, "hidden_size": 256, "ffn_hidden_size": 768,
                  "num_layers": 4, "num_attention_heads": 8, "num_kv_heads": 4, "max_position_embeddings": 256,
                  "encoder_seq_length": 256, "optim": {"name": "adamw", "lr": 1e-3, "sched": {"name": "constant"}}},
        "precision": {"type": "fp32"},
    }
    return _merge(base, sections)
