"""The YAML config: OmegaConf composition, schema, loading with overrides, whole-config validation."""

from nxd_training.config.loader import compose, dump_config, hub_names, load_config, parse_config, read_yaml, resolve
from nxd_training.config.overrides import parse_override
from nxd_training.config.plan import resolve_config
from nxd_training.config.resolved import load_resolved, model_config_of, model_spec_of
from nxd_training.config.schema import TrainingConfig

__all__ = ["TrainingConfig", "compose", "dump_config", "hub_names", "load_config", "load_resolved", "model_config_of",
           "model_spec_of", "parse_config", "parse_override", "read_yaml", "resolve", "resolve_config"]
