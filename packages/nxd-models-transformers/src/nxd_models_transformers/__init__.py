"""Any transformers causal LM as an nxd model family: transformers' own class, its own TP plan."""

from nxd_models_transformers.hf_io import load_hf_checkpoint, save_hf_checkpoint
from nxd_models_transformers.spec import SPEC, build, config_from_dict

__all__ = ["SPEC", "build", "config_from_dict", "load_hf_checkpoint", "save_hf_checkpoint"]
