import os
import sys

import pytest

# Tests import their helpers (legacy_env.py, example_run.py) by name; pytest runs in importlib mode.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


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
