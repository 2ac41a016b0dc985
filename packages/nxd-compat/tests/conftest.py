import os
import sys

import pytest

# Tests import their helpers (legacy_env.py, example_run.py) by name; pytest runs in importlib mode.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def xla_stand_in(monkeypatch):
    """The torch-xla / torch-neuronx stand-ins importable, as under ``nxd-compat-run``, and undone after
    the test: importing the stand-in installs the xla emulation (``Tensor.to``, torch's CUDA-autocast
    check, NXD_BACKEND), which would otherwise leak into every later test of a one-process run."""
    import torch
    import torch.cuda.amp.common as amp_common

    from nxd_compat import run, xla_emulation

    monkeypatch.setattr(torch.Tensor, "to", torch.Tensor.to)
    monkeypatch.setattr(amp_common, "amp_definitely_not_available", amp_common.amp_definitely_not_available)
    monkeypatch.setattr(xla_emulation, "_installed", [])
    # install() sets NXD_BACKEND: setenv records the value to restore (unset included), as delenv alone would not
    monkeypatch.setenv("NXD_BACKEND", os.environ.get("NXD_BACKEND", ""))
    if not os.environ["NXD_BACKEND"]:
        monkeypatch.delenv("NXD_BACKEND")
    monkeypatch.syspath_prepend(str(run.STAND_IN))
    stand_ins = ("torch_xla", "torch_neuronx")
    for name in [m for m in sys.modules if m.startswith(stand_ins)]:
        monkeypatch.delitem(sys.modules, name)
    yield
    for name in [m for m in sys.modules if m.startswith(stand_ins)]:
        del sys.modules[name]


@pytest.fixture(scope="session")
def legacy_python(tmp_path_factory):
    """The python of the NxD examples' pinned environment, built once for every example test."""
    from legacy_env import build

    return build(tmp_path_factory.mktemp("nxd_examples_env"))


@pytest.fixture(scope="session")
def neox_python(tmp_path_factory):
    """The python of NxD's GPT-NeoX example environment (transformers 4.26), built once."""
    from legacy_env import NEOX_PINS, build

    return build(tmp_path_factory.mktemp("nxd_neox_env"), NEOX_PINS)


@pytest.fixture(scope="session")
def bert_python(tmp_path_factory):
    """The python of NxD's BERT example environment (transformers 4.26 + h5py), built once."""
    from legacy_env import BERT_PINS, build

    return build(tmp_path_factory.mktemp("nxd_bert_env"), BERT_PINS)
