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
