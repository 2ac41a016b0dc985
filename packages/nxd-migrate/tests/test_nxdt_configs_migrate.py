"""``nxd migrate config`` on NxD Training's published example configs (vendored, with attribution,
in nxd-training's test data): recognised as NxDT's layout, interpolations resolved by nxd-training's
loader, copied unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from nxd.cli import main as nxd_main
from nxd_training.config import read_yaml

CONF = Path(__file__).resolve().parents[2] / "nxd-training" / "tests" / "data" / "nxdt_conf"
NAMES = sorted(p.name[: -len(".yaml")] for p in CONF.glob("*.yaml"))


def test_the_vendored_configs_are_there() -> None:
    assert len(NAMES) == 22, CONF


@pytest.mark.parametrize("name", NAMES)
def test_nxd_migrate_config_reads_nxdt_configs(name: str, tmp_path: Path) -> None:
    out = tmp_path / "out.yaml"
    assert nxd_main(["migrate", "config", str(CONF / f"{name}.yaml"), "-o", str(out)]) == 0
    assert read_yaml(out) == read_yaml(CONF / f"{name}.yaml")
