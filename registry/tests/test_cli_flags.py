"""``nxd.cli.take_trailing_flags``: a verb's flags written after its overrides."""

from __future__ import annotations

import argparse

import pytest

from nxd import ConfigError
from nxd.cli import take_trailing_flags


def _args(*overrides: str) -> argparse.Namespace:
    return argparse.Namespace(overrides=list(overrides), validate=False, device_memory=None, device=None)


def test_switches_and_values_leave_the_overrides() -> None:
    args = _args("a.b=1", "--validate", "--device-memory", "16", "c=2", "--device=h100")
    take_trailing_flags(args, ("--validate",), {"--device-memory": float, "--device": str})
    assert args.overrides == ["a.b=1", "c=2"]
    assert (args.validate, args.device_memory, args.device) == (True, 16.0, "h100")


@pytest.mark.parametrize("tail, message", [(("--device-memory",), "--device-memory needs a value"),
                                           (("--device-memory=lots",), "--device-memory: not a number: 'lots'")])
def test_a_bad_value_names_the_flag(tail: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        take_trailing_flags(_args("a=1", *tail), (), {"--device-memory": float})
