"""The YAML config: OmegaConf composition, schema, loading with overrides, whole-config validation."""

from nxd_training.config.loader import compose, dump_config, hub_names, load_config, parse_config, read_yaml, resolve
from nxd_training.config.overrides import parse_override
from nxd_training.config.plan import RunPlan, make_plan, resolve_config
from nxd_training.config.resolved import Resolution, ResolvedConfig, load_resolved
from nxd_training.config.schema import TrainingConfig

__all__ = ["Resolution", "ResolvedConfig", "RunPlan", "TrainingConfig", "compose", "dump_config", "hub_names",
           "load_config", "load_resolved", "make_plan", "parse_config", "parse_override", "read_yaml", "resolve",
           "resolve_config"]
