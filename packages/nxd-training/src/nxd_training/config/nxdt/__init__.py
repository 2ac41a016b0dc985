"""The NxDT translator: the one place NxD Training's names live once its YAML is parsed.

The YAML schema (``nxd_training.config.schema``) is what the user writes; this package turns it
into the core's :class:`nxd.run_config.RunConfig`, which everything after resolution reads:

- ``translate``: the sections -> RunConfig (``trainer.gradient_clip_val`` -> ``optimizer.max_grad_norm``, ...);
- ``keys``: NxDT's ``model`` keys as Hugging Face keys, and the YAML key behind each NxD name;
- ``peft``: ``model_alignment_strategy.peft`` -> nxd-lora's ``LoraConfig`` with NxDT's defaults;
- ``history``: keys of earlier NxDT releases, Neuron-only keys, keys accepted without effect;
- ``precision``: ``precision.type``'s names and what each one means (autocast, bf16 parameters, master weights).
"""

from nxd_training.config.nxdt.history import key_notes, lift_alignment
from nxd_training.config.nxdt.keys import MODEL_KEY_MAP, YAML_KEYS, yaml_keys_named
from nxd_training.config.nxdt.peft import lora_config
from nxd_training.config.nxdt.translate import run_config

__all__ = ["MODEL_KEY_MAP", "YAML_KEYS", "key_notes", "lift_alignment", "lora_config", "run_config",
           "yaml_keys_named"]
