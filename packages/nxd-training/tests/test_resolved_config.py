"""One resolved config: what `nxd train` validates and prints is what every rank reads back.

Issue 29: NxDT's megatron_gpt config passed --validate (model 'gpt') and then failed on every rank,
because the ranks parsed the written config.yaml again and every key spelled out in it (the default
``architecture: llama`` included) counted as "set by the user".
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from nxd import ConfigError
from nxd.cli import main
from nxd_training.config import dump_config, load_config, load_resolved, model_spec_of, parse_config, resolve_config

CONF = Path(__file__).parent / "data" / "nxdt_conf"
NAMES = sorted(p.name[: -len(".yaml")] for p in CONF.glob("*.yaml"))


def test_a_written_config_resolves_to_the_same_run(make_config, tmp_path: Path) -> None:
    """The sections of a written config, read again as a plain YAML, describe the same run: no key
    means something else because the file spells it out (Megatron keys and GPT defaults included)."""
    config = load_config(make_config(model={"architecture": None}, model_source="megatron"))
    assert config.run.derived.architecture == "gpt" and config.model.architecture == "gpt"
    again = load_config(yaml.safe_load(dump_config(config)))
    # the same run; only the reason reads differently now (model.architecture names the choice)
    assert dataclasses.replace(again.run.derived, architecture_reason="") == \
        dataclasses.replace(config.run.derived, architecture_reason="")
    assert dataclasses.replace(again.run, derived=None) == dataclasses.replace(config.run, derived=None)
    # the sections alone (no `resolved`), as a user would copy them into a new YAML
    sections = {k: v for k, v in yaml.safe_load(dump_config(config)).items() if k != "resolved"}
    assert resolve_config(parse_config(sections)).run.derived.model == config.run.derived.model


def test_ranks_deserialise_what_the_cli_resolved(make_config, tmp_path: Path) -> None:
    config = load_config(make_config(model={"architecture": None}, model_source="megatron"))
    path = tmp_path / "config.yaml"
    path.write_text(dump_config(config))
    read = load_resolved(path)
    assert read == config and read.run == config.run and read.run is not config.run
    assert model_spec_of(read.run).name == "gpt" and read.run.derived.model == config.run.derived.model
    # an edited run config is refused on the ranks, never resolved again there
    edited = yaml.safe_load(path.read_text())
    edited["model"]["hidden_size"] = 64
    path.write_text(yaml.safe_dump(edited, sort_keys=False))
    with pytest.raises(ConfigError, match="edited after `nxd train` resolved them"):
        load_resolved(path)
    with pytest.raises(ConfigError, match="not a resolved config"):
        load_resolved(_write(tmp_path / "plain.yaml", make_config()))


def _write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def test_print_config_prints_the_resolved_config_and_exits(make_config, tmp_path: Path, capsys) -> None:
    config = make_config(model={"architecture": None}, model_source="megatron")
    path = _write(tmp_path / "cfg.yaml", config)
    assert main(["train", str(path), "exp_manager.name=pc", "--print-config"]) == 0
    out = capsys.readouterr()
    printed = yaml.safe_load(out.out)  # stdout is the YAML alone
    assert printed["resolved"]["derived"]["architecture"] == "gpt" and printed["model"]["architecture"] == "gpt"
    assert "not training (--print-config)" in out.err
    assert not (Path(config["exp_manager"]["exp_dir"]) / "pc").exists()  # nothing started, nothing written
    # the printed file is a config nxd train reads back to the same resolution
    again = load_config(_write(tmp_path / "printed.yaml", printed))
    assert again.run.derived.model == printed["resolved"]["derived"]["model"]


@pytest.mark.parametrize("name", NAMES)
def test_every_nxdt_config_round_trips_through_the_written_file(name: str, tmp_path: Path) -> None:
    """Every vendored NxDT config: the architecture and model keys survive being written out and
    read back as sections (the schema has no default that means something else once spelled out)."""
    from nxd_training.config.features import select_model

    raw = yaml.safe_load((CONF / f"{name}.yaml").read_text())
    sections = parse_config(raw)
    written = parse_config(yaml.safe_load(dump_config(sections)))
    assert (select_model(written.model, written.model_source, written.name, None)
            == select_model(sections.model, sections.model_source, sections.name, None))
    assert written == sections
