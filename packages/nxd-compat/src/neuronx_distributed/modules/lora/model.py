"""``neuronx_distributed.modules.lora.model``: ``LoraModel`` (nxd-lora) and NxD's module constants."""

import nxd_lora
from neuronx_distributed.utils.logger import get_logger

__all__ = ["CONFIG_NAME", "MODELS_TO_LORA_TARGET_MODULES_MAPPING", "WEIGHTS_NAME", "LoraModel"]

logger = get_logger()


class LoraModel(nxd_lora.LoRAModel):
    """nxd-lora's model under NxD's class name (its repr is NxD's: ``LoraModel(...)``)."""

#: NxD's file names of a single-device adapter save (nxd-lora writes PEFT's: adapter_model.safetensors)
WEIGHTS_NAME = "adapter_model.pt"
CONFIG_NAME = "adapter_config.json"
#: NxD's (PEFT's) default LoRA targets per Hugging Face model type
MODELS_TO_LORA_TARGET_MODULES_MAPPING = {
    "t5": ["q", "v"], "mt5": ["q", "v"], "bart": ["q_proj", "v_proj"], "gpt2": ["c_attn"],
    "bloom": ["query_key_value"], "blip-2": ["q", "v", "q_proj", "v_proj"], "opt": ["q_proj", "v_proj"],
    "gptj": ["q_proj", "v_proj"], "gpt_neox": ["query_key_value"], "gpt_neo": ["q_proj", "v_proj"],
    "bert": ["query", "value"], "roberta": ["query", "value"], "xlm-roberta": ["query", "value"],
    "electra": ["query", "value"], "deberta-v2": ["query_proj", "value_proj"], "deberta": ["in_proj"],
    "layoutlm": ["query", "value"], "llama": ["q_proj", "v_proj"], "chatglm": ["query_key_value"],
    "gpt_bigcode": ["c_attn"], "mpt": ["Wqkv"], "RefinedWebModel": ["query_key_value"],
    "RefinedWeb": ["query_key_value"], "falcon": ["query_key_value"], "btlm": ["c_proj", "c_attn"],
    "codegen": ["qkv_proj"], "mistral": ["q_proj", "v_proj"], "mixtral": ["q_proj", "v_proj"],
    "stablelm": ["q_proj", "v_proj"], "phi": ["q_proj", "v_proj", "fc1", "fc2"], "gemma": ["q_proj", "v_proj"],
}
