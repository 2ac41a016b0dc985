"""Fault injection for plugin discovery: a broken plugin is warned about and skipped (raised in
strict mode), and never takes the ``nxd`` command down; ``nxd plugins`` shows it as broken."""

from __future__ import annotations

import pytest

import nxd
from nxd.cli import main
from nxd.plugins import PluginWarning, plugin_infos

GOOD = """
import nxd
@nxd.hookimpl
def nxd_register_models(registry):
    registry.add("acme", object())
"""

BROKEN = {
    "wrong_signature": ("import nxd\n@nxd.hookimpl\ndef nxd_register_models(registry, extra):\n    pass\n",
                        "does not match nxd's hook contract"),
    "raising_hook": ("import nxd\n@nxd.hookimpl\ndef nxd_register_models(registry):\n    raise RuntimeError('boom')\n",
                     "nxd_register_models hook raised RuntimeError"),
    "exits_at_import": ("import sys\nsys.exit(3)\n", "failed to import: SystemExit"),
    "registers_none": ("import nxd\n@nxd.hookimpl\ndef nxd_register_models(registry):\n    registry.add('ghost', None)\n",
                       "registered the model 'ghost' as None"),
}


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_broken_plugin_is_skipped_and_the_cli_keeps_working(kind, fake_distribution, load_only, monkeypatch, capsys):
    source, reason = BROKEN[kind]
    fake_distribution("bad-plugin", "bad_plugin", source)
    fake_distribution("acme-models", "acme_models", GOOD)
    load_only("bad_plugin", "acme_models")
    with pytest.warns(PluginWarning, match=reason):
        assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "bad-plugin" in out and "[skipped]" in out and reason.split(":")[0] in out
    assert nxd.list_components("model") == ["acme"]  # the healthy plugin is untouched
    info = next(i for i in plugin_infos() if i.name == "bad_plugin")
    assert info.status == "skipped" and info.components == {}
    monkeypatch.setenv("NXD_STRICT_PLUGINS", "1")
    nxd.plugins.reset()
    assert main(["plugins"]) == 2  # strict mode: a clean error, no traceback
    assert "NXD_STRICT_PLUGINS" in capsys.readouterr().err


def test_a_half_registered_plugin_leaves_nothing_behind(fake_distribution, load_only):
    source = GOOD.replace('registry.add("acme", object())', 'registry.add("half", object())\n    raise ValueError("late")')
    fake_distribution("half-plugin", "half_plugin", source)
    load_only("half_plugin")
    with pytest.warns(PluginWarning, match="raised ValueError"):
        assert nxd.list_components("model") == []


def test_duplicate_name_is_a_clean_error_when_used(fake_distribution, load_only, capsys):
    fake_distribution("acme-models", "acme_models", GOOD)
    fake_distribution("other-models", "other_models", GOOD)
    load_only("acme_models", "other_models")
    with pytest.warns(PluginWarning):
        assert main(["plugins"]) == 0
    assert "registered twice" in capsys.readouterr().out


RAISING_VALIDATOR = """
import nxd
@nxd.hookimpl
def nxd_validate_config(nxd_config):
    return nxd_config.pipeline_config["no_such_key"]
"""


def test_a_crashing_validator_is_named_and_skipped(fake_distribution, load_only, capsys):
    fake_distribution("acme-checks", "acme_checks", RAISING_VALIDATOR)
    load_only("acme_checks")
    with pytest.warns(PluginWarning, match=r"nxd plugin 'acme_checks' from acme-checks: its nxd_validate_config hook "
                                           r"raised KeyError\('no_such_key'\); skipped it"):
        config = nxd.neuronx_distributed_config(tensor_parallel_size=1)
    assert config["tensor_parallel_size"] == 1  # the run goes on without the broken validator
    nxd.plugins.reset()
    assert main(["plugins"]) == 0  # the diagnostic command finds it before any launch does
    out = capsys.readouterr().out
    assert "acme-checks" in out and "[failing]" in out and "nxd_validate_config hook raised KeyError" in out


def test_a_plugin_name_clash_never_disables_a_built_in(fake_distribution, load_only, capsys):
    """A third-party distribution (sorting first) exposes the entry-point name of a first-party
    one: the first-party plugin loads, the other is skipped naming both, and every command runs."""
    fake_distribution("nxd-lora", "nxd_lora_stub", GOOD.replace('"acme"', '"builtin_model"'), entry_name="lora")
    fake_distribution("aaa-lora", "aaa_lora", GOOD.replace('"acme"', '"third_party_model"'), entry_name="lora")
    load_only("lora")
    with pytest.warns(PluginWarning, match=r"'lora' from aaa-lora was skipped: its plugin name 'lora' is already "
                                           r"taken by nxd-lora"):
        assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "nxd-lora" in out and "aaa-lora" in out and "[skipped]" in out
    assert nxd.list_components("model") == ["builtin_model"]
    assert main(["plugins", "--json"]) == 0


RAISING_PLANNER = """
import nxd
@nxd.hookimpl(tryfirst=True)
def nxd_plan_run(config, device_memory_gib):
    raise RuntimeError("plan boom")
"""

RAISING_WRAPPERS = """
import nxd
@nxd.hookimpl
def nxd_checkpoint_extras(model, path, tag, phase, context):
    raise RuntimeError("extras boom")
"""


def test_a_crashing_planner_is_named_and_skipped(fake_distribution, load_only, capsys):
    """`nxd train --validate` ended with the plugin's traceback; planning never blocks a run."""
    fake_distribution("acme-planner", "acme_planner", RAISING_PLANNER)
    load_only("acme_planner")
    with pytest.warns(PluginWarning, match=r"nxd plugin 'acme_planner' from acme-planner: its nxd_plan_run hook "
                                           r"raised RuntimeError\('plan boom'\); skipped it"):
        assert nxd.trainer.plan_run({"any": "config"}) is None


def test_a_crashing_extras_hook_names_its_plugin(fake_distribution, load_only, tmp_path):
    """In a rank, this failed as a bare RuntimeError ('extras boom'): the last line of `nxd train`
    named no plugin. It is not optional (an export would silently be missing)."""
    import torch

    from nxd.errors import PluginError

    fake_distribution("acme-wrappers", "acme_wrappers", RAISING_WRAPPERS)
    load_only("acme_wrappers")
    with pytest.raises(PluginError, match=r"'acme_wrappers' from acme-wrappers: its nxd_checkpoint_extras hook "
                                          r"raised RuntimeError\('extras boom'\)"):
        nxd.trainer.checkpoint_extras(torch.nn.Linear(1, 1), str(tmp_path), "t", "saved", context=object())
