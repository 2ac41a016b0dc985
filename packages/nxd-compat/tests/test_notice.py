"""The notice: once per process that ``neuronx_distributed`` is nxd, and always when AWS's
neuronx-distributed distribution is installed next to nxd-compat (simulated with a real
``.dist-info`` on the path, which importlib.metadata reads as an installed distribution)."""

from __future__ import annotations

import sys

import pytest

from nxd_compat import notice


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(notice, "_announced", False)
    monkeypatch.delenv(notice.QUIET_ENV, raising=False)


def test_warns_once_that_it_is_nxd(fresh):
    with pytest.warns(notice.NxdCompatWarning, match="provided by nxd-compat"):
        notice.announce()
    notice.announce()  # second call: silent (pytest would fail on an unexpected warning only with -W error)
    assert notice._announced


def test_quiet_env_silences_the_notice(fresh, monkeypatch, recwarn):
    monkeypatch.setenv(notice.QUIET_ENV, "1")
    notice.announce()
    assert not [w for w in recwarn if issubclass(w.category, notice.NxdCompatWarning)]


def test_a_real_neuronx_distributed_is_reported_even_when_quiet(fresh, monkeypatch, tmp_path):
    dist_info = tmp_path / "neuronx_distributed-0.9.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: neuronx-distributed\nVersion: 0.9.0\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    monkeypatch.setenv(notice.QUIET_ENV, "1")
    assert notice.real_nxd_version() == "0.9.0"
    with pytest.warns(notice.NxdCompatWarning, match="neuronx-distributed 0.9.0 is installed next to nxd-compat"):
        notice.announce()
