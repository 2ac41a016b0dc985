"""DeepSeek-V3 (spec ``deepseek_v3``) on nxd: multi-head latent attention, dense first layers,
routed + shared experts with sigmoid group-limited routing and aux-loss-free balancing (nxd-moe),
Hugging Face import/export through nxd-models-mixtral's."""

from nxd_models_deepseek.attention import DeepseekV3Attention
from nxd_models_deepseek.config import DeepseekV3Config
from nxd_models_deepseek.modeling import DeepseekV3DecoderLayer, DeepseekV3ForCausalLM
from nxd_models_deepseek.presets import PRESETS
from nxd_models_deepseek.spec import SPEC, build, flops_per_token

__version__ = "0.1.0"

__all__ = ["PRESETS", "SPEC", "DeepseekV3Attention", "DeepseekV3Config", "DeepseekV3DecoderLayer",
           "DeepseekV3ForCausalLM", "build", "flops_per_token"]
