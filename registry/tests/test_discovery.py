"""Entry-point discovery: loading, filtering, broken plugins, strict mode, duplicates, API versions."""

from __future__ import annotations

import pytest

import nxd
from nxd.plugins import PluginWarning, plugin_infos

GOOD_MODEL_PLUGIN = """
import nxd
NXD_PLUGIN_API = (3, 3)

class Spec:
    name = "{name}"

@nxd.hookimpl
def nxd_register_models(registry):
    registry.add("{name}", Spec())
"""


def test_core_alone_lists_only_itself():
    infos = list(plugin_infos())
    assert [(i.name, i.status) for i in infos if i.status == "loaded"] == [("nxd", "loaded")]
    assert nxd.list_components("command") == ["plugins"]


def test_entry_point_plugin_is_discovered_and_registers(fake_distribution, monkeypatch, load_only):
    fake_distribution("acme-models", "acme_models", GOOD_MODEL_PLUGIN.format(name="acme"))
    load_only("acme_models")
    assert nxd.get_model("acme").name == "acme"
    info = next(i for i in plugin_infos() if i.name == "acme_models")
    assert (info.distribution, info.version, info.components) == ("acme-models", "1.2.3", {"model": ["acme"]})


def test_load_by_distribution_name_and_disable(fake_distribution, monkeypatch, load_only):
    fake_distribution("acme-models", "acme_models", GOOD_MODEL_PLUGIN.format(name="acme"))
    load_only("acme-models")
    assert "acme" in nxd.list_components("model")
    monkeypatch.setenv("NXD_DISABLE_PLUGINS", "acme_models")
    nxd.plugins.reset()
    assert "acme" not in nxd.list_components("model")
    assert next(i for i in plugin_infos() if i.name == "acme_models").status == "disabled"


def test_broken_plugin_warns_and_is_skipped(fake_distribution, monkeypatch, load_only):
    fake_distribution("broken-plugin", "broken_plugin", "raise ImportError('needs libfoo')")
    fake_distribution("acme-models", "acme_models", GOOD_MODEL_PLUGIN.format(name="acme"))
    load_only("broken_plugin", "acme_models")
    with pytest.warns(PluginWarning, match=r"'broken_plugin' from broken-plugin was skipped: failed to import.*needs libfoo"):
        assert nxd.list_components("model") == ["acme"]
    assert next(i for i in plugin_infos() if i.name == "broken_plugin").status == "skipped"


def test_broken_plugin_raises_in_strict_mode(fake_distribution, monkeypatch, load_only):
    fake_distribution("broken-plugin", "broken_plugin", "raise ImportError('needs libfoo')")
    load_only("broken_plugin")
    monkeypatch.setenv("NXD_STRICT_PLUGINS", "1")
    with pytest.raises(nxd.PluginError, match="broken_plugin.*needs libfoo.*NXD_STRICT_PLUGINS"):
        nxd.list_components("model")


def test_duplicate_component_names_both_distributions(fake_distribution, monkeypatch, load_only):
    fake_distribution("acme-models", "acme_models", GOOD_MODEL_PLUGIN.format(name="llama"))
    fake_distribution("other-models", "other_models", GOOD_MODEL_PLUGIN.format(name="llama"))
    load_only("acme_models", "other_models")
    # the second plugin is skipped with a warning naming both; every other verb keeps working ...
    with pytest.warns(PluginWarning, match="model 'llama' is registered twice: by acme-models and by other-models"):
        assert nxd.list_components("model") == ["llama"]
    assert next(i for i in plugin_infos() if i.name == "other_models").status == "skipped"
    # ... but using the contested name is an error, never a silent pick of one of them
    with pytest.raises(nxd.PluginError) as err:
        nxd.get_model("llama")
    assert "model 'llama' is registered twice" in str(err.value)
    assert "acme-models" in str(err.value) and "other-models" in str(err.value)
    monkeypatch.setenv("NXD_STRICT_PLUGINS", "1")
    nxd.plugins.reset()
    with pytest.raises(nxd.PluginError, match="registered twice"):
        nxd.list_components("model")


def test_misspelled_hook_is_caught(fake_distribution, monkeypatch, load_only):
    source = "import nxd\n@nxd.hookimpl\ndef nxd_register_modles(registry):\n    pass\n"
    fake_distribution("typo-plugin", "typo_plugin", source)
    load_only("typo_plugin")
    with pytest.warns(PluginWarning, match="nxd_register_modles"):
        nxd.list_components("model")
    monkeypatch.setenv("NXD_STRICT_PLUGINS", "1")
    nxd.plugins.reset()
    with pytest.raises(nxd.PluginError, match="does not define"):
        nxd.list_components("model")


def test_incompatible_plugin_api_is_refused(fake_distribution, monkeypatch, load_only):
    fake_distribution("future-plugin", "future_plugin", "NXD_PLUGIN_API = (5, 6)\n")
    load_only("future_plugin")
    with pytest.warns(PluginWarning, match=r"supports plugin-API versions 5\.\.6.*speaks version 4 \(and accepts 2\.\.4\)"):
        list(plugin_infos())
    monkeypatch.setenv("NXD_STRICT_PLUGINS", "1")
    nxd.plugins.reset()
    with pytest.raises(nxd.PluginError, match="plugin-API versions 5..6"):
        list(plugin_infos())


def test_malformed_api_declaration_is_refused(fake_distribution, monkeypatch, load_only):
    fake_distribution("odd-plugin", "odd_plugin", "NXD_PLUGIN_API = '1'\n")
    load_only("odd_plugin")
    with pytest.warns(PluginWarning, match=r"NXD_PLUGIN_API must be a \(min, max\) pair"):
        list(plugin_infos())


def test_missing_component_names_the_distribution_to_install():
    with pytest.raises(nxd.ComponentNotFound, match=r"no model named 'llama' is installed: pip install nxd-models-llama \(installed models: none\)"):
        nxd.get_model("llama")
    with pytest.raises(nxd.ComponentNotFound, match="pip install nxd-pipeline"):
        nxd.get_schedule("1f1b")
    with pytest.raises(nxd.ComponentNotFound, match="no data module named 'mystery' is installed; installed data modules: none"):
        nxd.get_data_module("mystery")
    with pytest.raises(nxd.ComponentNotFound, match=r"model_alignment_strategy.dpo needs the workflow 'dpo': "
                       r"pip install nxd-alignment"):
        nxd.get_workflow("dpo", need="model_alignment_strategy.dpo")


def test_in_process_registration():
    class Plugin:
        @nxd.hookimpl
        def nxd_register_storages(self, registry):
            registry.add("memory", dict)

    nxd.register_plugin(Plugin(), name="mem", distribution="tests")
    assert nxd.get_storage("memory") is dict
    with pytest.raises(nxd.PluginError, match="two plugins are named 'mem'"):
        nxd.register_plugin(Plugin(), name="mem", distribution="tests-again")


def test_a_plugin_for_plugin_api_1_is_refused_naming_the_versions(fake_distribution, load_only):
    fake_distribution("old-plugin", "old_plugin", "NXD_PLUGIN_API = (1, 1)\n")
    load_only("old_plugin")
    with pytest.warns(PluginWarning, match=r"supports plugin-API versions 1\.\.1.*speaks version 4 \(and accepts 2\.\.4\)"):
        assert [i.status for i in plugin_infos() if i.name == "old_plugin"] == ["skipped"]


def test_a_plugin_still_implementing_nxd_wrap_model_is_told_what_replaces_it(fake_distribution, load_only):
    # undeclared (so not refused for its version): the removed hook itself is named, not "misspelled?"
    fake_distribution("old-wrapper", "old_wrapper", """
        import nxd
        @nxd.hookimpl
        def nxd_wrap_model(nxd_config, model, phase):
            return None
    """)
    load_only("old_wrapper")
    with pytest.warns(PluginWarning, match=r"implements nxd_wrap_model, removed in plugin-API 3: register a model "
                      r"transform instead \(nxd_register_model_transforms"):
        assert [i.status for i in plugin_infos() if i.name == "old_wrapper"] == ["skipped"]
