"""Users pip-install only the plugins they need: each subset discovers exactly what it installed,
and a third-party plugin is found from its own folder with no change to nxd."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _plugins(venv) -> dict[str, dict]:
    return {p["name"]: p for p in json.loads(venv.nxd("plugins", "--json").stdout)["plugins"]}


def test_core_then_plugins_then_third_party(fresh_venv):
    fresh_venv.install("nxd")
    plugins = _plugins(fresh_venv)
    assert list(plugins) == ["nxd"]
    assert plugins["nxd"]["components"] == {"command": ["plugins"]}

    missing = fresh_venv.nxd("train", "cfg.yaml", check=False)
    assert missing.returncode == 2 and "pip install nxd-training" in missing.stderr

    fresh_venv.install(str(ROOT / "integration_tests" / "example_plugin"))
    plugins = _plugins(fresh_venv)
    assert plugins["tinylm"]["distribution"] == "nxd-example-tinylm"
    assert plugins["tinylm"]["components"] == {"model": ["tinylm"], "model_transform": ["tinylm_bf16"]}

    fresh_venv.install("nxd-models-llama", "nxd-modeling", "nxd-context-parallel", "nxd-tensor-parallel",
                       "nxd-core-parallel", "nxd")
    plugins = _plugins(fresh_venv)
    assert {"nxd", "tinylm", "llama", "core_parallel"} <= set(plugins)
    assert not {"pipeline", "zero1", "lora", "ckpt", "data", "training"} & set(plugins)
