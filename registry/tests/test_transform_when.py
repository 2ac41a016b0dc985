"""``applies`` as data (:class:`nxd.transforms.When`): the runner reads the resolved config itself."""

from __future__ import annotations

import pytest

from nxd.errors import PluginError
from nxd.resolved import NxdConfig
from nxd.transforms import ALWAYS, ModelTransform, When, check_transform


@pytest.mark.parametrize(("rule", "given", "expected"), [
    (ALWAYS, {}, True),
    (When("pad_model"), {}, False),
    (When("pad_model"), {"pad_model": True}, True),
    (When("activation_checkpoint_config"), {"activation_checkpoint_config": []}, True),  # set, even if empty
    (When("data_parallel_strategy", equals="ddp"), {}, True),
    (When("data_parallel_strategy", equals="zero1"), {"optimizer_config": {"zero_one_enabled": True}}, True),
    (When("pipeline_parallel_size", above=1), {"pipeline_parallel_size": 1}, False),
    (When("pipeline_parallel_size", above=1), {"pipeline_parallel_size": 2}, True),
    (When("model_transforms", contains="fp8"), {}, False),
    (When("model_transforms", contains="fp8"), {"model_transforms": {"fp8": {}}}, True),
])
def test_a_rule_reads_the_config_with_its_defaults(rule, given, expected):
    assert rule.holds(NxdConfig.of(given)) is expected


def test_applies_must_be_a_rule_or_a_callable():
    check_transform("ok", ModelTransform("ok", "adapter", lambda m, c, k: None, lambda context, config: True))
    with pytest.raises(PluginError, match="applies='pad_model'"):
        check_transform("bad", ModelTransform("bad", "adapter", lambda m, c, k: None, "pad_model"))
