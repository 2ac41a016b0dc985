"""``data.prepare: quickstart``: build the embedded corpus (tokenizer + indexed dataset) before
launch, once, and point the data section at it."""

from __future__ import annotations

import os
from pathlib import Path

from nxd import ConfigError
from nxd_training.config.schema import TrainingConfig


def default_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "nxd"


def prepare_data(config: TrainingConfig) -> TrainingConfig:
    """Return ``config`` with ``data.data_prefix``/``data.tokenizer`` filled when ``data.prepare``
    asks for the embedded corpus (cached: a second call only checks the files)."""
    data = config.data
    if data.prepare is None:
        return config
    try:
        from nxd_data.quickstart import prepare_quickstart_data
    except ImportError as exc:
        raise ConfigError(f"data.prepare=quickstart needs nxd-data's quickstart corpus: pip install nxd-data ({exc})") from None
    vocab = config.model.vocab_size or 4096
    out = Path(data.prepare_dir) if data.prepare_dir else default_cache() / f"quickstart-v{vocab}"
    paths = prepare_quickstart_data(str(out), vocab_size=vocab)
    result = config.model_copy(deep=True)
    extra = result.data.model_extra
    assert extra is not None
    extra["data_prefix"] = str(paths["data_prefix"])
    result.data.tokenizer = str(paths["tokenizer"])
    result.data.prepare = None
    return result
