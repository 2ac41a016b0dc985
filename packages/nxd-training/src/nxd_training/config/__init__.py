"""The YAML config: schema, loading with overrides, and whole-config validation."""

from nxd_training.config.loader import dump_config, hub_names, load_config, parse_config, read_yaml
from nxd_training.config.overrides import apply_overrides, parse_override
from nxd_training.config.plan import RunPlan, make_plan
from nxd_training.config.schema import TrainingConfig

__all__ = ["RunPlan", "TrainingConfig", "apply_overrides", "dump_config", "hub_names", "load_config", "make_plan",
           "parse_config", "parse_override", "read_yaml"]
