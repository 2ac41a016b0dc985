"""NxDT's names for values other formats name differently: its ``model`` keys as Hugging Face
``config.json`` keys (what model plugins take), and the YAML key behind each NxD config name a
rank's error may use (a refusal before launch names the key the user sets,
``distributed_strategy.tensor_model_parallel_size=3``, not only NxD's ``tensor_parallel_size``)."""

from __future__ import annotations

import re
from typing import Any

#: NxDT key in ``model`` -> Hugging Face ``config.json`` key (what model plugins accept)
MODEL_KEY_MAP: dict[str, str] = {
    "num_layers": "num_hidden_layers",
    "hidden_size": "hidden_size",
    "ffn_hidden_size": "intermediate_size",
    "num_attention_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "kv_channels": "head_dim",
    "vocab_size": "vocab_size",
    "rope_theta": "rope_theta",
    "max_position_embeddings": "max_position_embeddings",
    "layernorm_epsilon": "rms_norm_eps",
    "share_embeddings_and_output_weights": "tie_word_embeddings",
    "init_method_std": "initializer_range",
}

#: NxD's name (``neuronx_distributed_config`` and the layers' messages) -> the YAML key that sets it
YAML_KEYS = {
    "tensor_parallel_size": "distributed_strategy.tensor_model_parallel_size",
    "tensor_model_parallel_size": "distributed_strategy.tensor_model_parallel_size",
    "pipeline_parallel_size": "distributed_strategy.pipeline_model_parallel_size",
    "pipeline_model_parallel_size": "distributed_strategy.pipeline_model_parallel_size",
    "context_parallel_size": "distributed_strategy.context_parallel_size",
    "expert_parallel_size": "distributed_strategy.expert_model_parallel_size",
    "expert_model_parallel_size": "distributed_strategy.expert_model_parallel_size",
    "sequence_parallel": "distributed_strategy.sequence_parallel",
    "zero_one_enabled": "distributed_strategy.zero1",
}


def yaml_keys_named(text: str, config: Any) -> list[str]:
    """``key=value`` for each YAML key whose NxD name ``text`` mentions and that ``text`` does not
    already name, with ``config``'s value (a resolved :class:`TrainingConfig`)."""
    out: list[str] = []
    for name, key in YAML_KEYS.items():
        if key in text or not re.search(rf"(?<![.\w]){name}\b", text):
            continue
        section, field = key.split(".")
        named = f"{key}={getattr(getattr(config, section), field)}"
        if named not in out:
            out.append(named)
    return out
