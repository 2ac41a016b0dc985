"""Open a Hugging Face dataset written by ``save_to_disk`` (``Dataset`` or ``DatasetDict``).

``datasets`` is the optional extra ``nxd-data[hf]``; it is imported only here, and only when such a
directory is actually read. Every error names the directory and what exists there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nxd.errors import ConfigError

INSTALL_HINT = "pip install 'nxd-data[hf]' (or export the dataset to JSONL/parquet first)"


def is_saved_dataset(path: Path) -> bool:
    """True for a directory ``save_to_disk`` wrote (a ``Dataset`` or a ``DatasetDict``)."""
    return path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file())


def _datasets(path: Path, where: str) -> Any:
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            f"{where}: {path} is a Hugging Face dataset saved to disk; reading it needs the 'datasets' "
            f"package: {INSTALL_HINT}"
        ) from None
    return datasets


def load_saved_dataset(path: str | Path, split: str | None = "train", *, where: str = "input") -> Any:
    """The ``datasets.Dataset`` at ``path``; for a ``DatasetDict``, its split ``split``.

    A single saved ``Dataset`` has no splits to choose from, so ``split`` is ignored for it.
    ``where`` names the setting the path came from (``data.train_dir``, ``--input``) in errors.
    """
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{where}: {path} does not exist")
    if not is_saved_dataset(path):
        raise ConfigError(
            f"{where}: {path} is not a Hugging Face dataset saved with save_to_disk "
            "(no state.json or dataset_dict.json in it)"
        )
    datasets = _datasets(path, where)
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as exc:  # noqa: BLE001 - datasets raises many types for a damaged directory
        raise ConfigError(f"{where}: {path} could not be loaded as a saved HF dataset ({type(exc).__name__}: {exc})") from exc
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise ConfigError(f"{where}: {path} has no split {split!r} (splits: {', '.join(ds) or 'none'})")
        ds = ds[split]
    return ds


def require_column(ds: Any, column: str, path: str | Path, where: str) -> None:
    if column not in ds.column_names:
        raise ConfigError(
            f"{where}: {path} has no column {column!r} (columns: {', '.join(ds.column_names) or 'none'})"
        )
