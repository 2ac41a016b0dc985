"""``neuronx_distributed.modules.lora.layer``: NxD's per-layer LoRA wrappers.

nxd-lora adapts layers through ``LoraModel`` / ``get_lora_model`` (a ``LoraAdapter`` beside each
targeted layer, PEFT's math and file format), not by replacing them with wrapper classes; NxD's
wrapper classes are not provided.
"""

from nxd_compat.surface import not_provided

_USE = "wrap the model with neuronx_distributed.modules.lora.LoraModel(model, LoraConfig(target_modules=[...]))"
__getattr__ = not_provided(__name__, {n: _USE for n in ("LoraLayer", "LoraLinear", "LoraEmbedding", "LoraConv2d")})
