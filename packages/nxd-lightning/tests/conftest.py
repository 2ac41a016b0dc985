"""The embedded quickstart corpus, prepared once per session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from nxd_data.quickstart import prepare_quickstart_data

    return prepare_quickstart_data(tmp_path_factory.mktemp("corpus"), vocab_size=512)
