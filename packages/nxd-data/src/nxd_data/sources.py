"""Read documents (strings) from text files, JSONL, parquet, or a Hugging Face dataset on disk.

Every error names the file (and line, for JSONL) and what would be valid.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from nxd.errors import ConfigError
from nxd_data.hf_disk import is_saved_dataset, load_saved_dataset, require_column

FORMATS = ("auto", "text", "jsonl", "parquet", "hf")
TEXT_MODES = ("file", "line", "paragraph")
ENCODING_ERRORS = ("strict", "replace", "ignore")


@contextmanager
def _decoding(path: Path, encoding: str) -> Iterator[None]:
    """Turn a decode failure into an error naming the file, the byte offset and the ways out."""
    try:
        yield
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not valid {encoding} text at byte {exc.start} ({exc.reason}); if the file is text in "
            "another encoding pass --encoding (e.g. latin-1), to replace undecodable bytes pass "
            "--encoding-errors replace, and binary files cannot be prepared"
        ) from None
    except LookupError as exc:  # an unknown codec name
        raise ConfigError(f"--encoding {encoding!r} is not a known text encoding ({exc})") from None


def detect_format(path: Path) -> str:
    if path.is_dir():
        if is_saved_dataset(path):
            return "hf"
        raise ConfigError(f"{path} is a directory but not a Hugging Face dataset saved with save_to_disk")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    if suffix == ".parquet":
        return "parquet"
    return "text"


def read_jsonl(path: Path, encoding: str = "utf-8", errors: str = "strict") -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` for every non-blank line; a malformed line names file:line."""
    with _decoding(path, encoding), open(path, encoding=encoding, errors=errors) as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{lineno}: malformed JSON line ({exc.msg} at column {exc.colno})") from None
            if not isinstance(record, dict):
                raise ConfigError(f"{path}:{lineno}: expected a JSON object per line, got {type(record).__name__}")
            yield lineno, record


def dev_choose_samples(config: dict[str, Any]) -> int | None:
    """NxDT's ``data.dev_choose_samples``: train (and validate) on the first N records of each
    split only (NxDT selects them before tokenising); null: every record."""
    limit = config.get("dev_choose_samples")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0):
        raise ConfigError(f"data.dev_choose_samples must be a positive integer or null, got {limit!r}")
    return limit


def field(record: dict[str, Any], key: str, where: str) -> str:
    if key not in record:
        raise ConfigError(f"{where}: missing field {key!r} (fields present: {', '.join(sorted(record)) or 'none'})")
    value = record[key]
    if not isinstance(value, str):
        raise ConfigError(f"{where}: field {key!r} must be a string, got {type(value).__name__}")
    return value


def _text_docs(path: Path, mode: str, encoding: str, errors: str) -> Iterator[str]:
    with _decoding(path, encoding):
        text = path.read_text(encoding=encoding, errors=errors)
    if mode == "file":
        yield text
    elif mode == "line":
        yield from (line for line in text.splitlines() if line.strip())
    else:
        yield from (p.strip("\n") for p in text.split("\n\n") if p.strip())


def _parquet_docs(path: Path, key: str) -> Iterator[str]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for a bad file
        raise ConfigError(f"{path}: not a readable parquet file ({exc})") from exc
    if key not in pf.schema_arrow.names:
        raise ConfigError(f"{path}: missing column {key!r} (columns: {', '.join(pf.schema_arrow.names)})")
    for batch in pf.iter_batches(columns=[key], batch_size=1024):
        yield from (v for v in batch.column(0).to_pylist() if v is not None)


def _hf_docs(path: Path, key: str, split: str) -> Iterator[str]:
    ds = load_saved_dataset(path, split, where="input")
    require_column(ds, key, path, "input")
    feature = ds.features[key]
    if getattr(feature, "dtype", None) not in ("string", "large_string"):
        raise ConfigError(
            f"input: column {key!r} of {path} holds {feature}, not text; pick a string column with --text-key "
            f"(string columns: {', '.join(c for c, f in ds.features.items() if getattr(f, 'dtype', None) in ('string', 'large_string')) or 'none'})"
        )
    for batch in ds.select_columns([key]).iter(batch_size=1024):
        yield from (v for v in batch[key] if v is not None)


def iter_documents(
    inputs: Sequence[str | Path],
    fmt: str = "auto",
    text_key: str = "text",
    text_mode: str = "file",
    hf_split: str = "train",
    encoding: str = "utf-8",
    encoding_errors: str = "strict",
) -> Iterator[str]:
    """Documents of ``inputs`` in order. ``text_mode`` splits plain text files: one document per
    ``file``, per non-blank ``line``, or per blank-line separated ``paragraph``. Text and JSONL
    files are decoded with ``encoding``; ``encoding_errors`` is Python's ``errors`` policy."""
    if encoding_errors not in ENCODING_ERRORS:
        raise ConfigError(f"encoding_errors={encoding_errors!r} is not known; valid: {', '.join(ENCODING_ERRORS)}")
    if fmt not in FORMATS:
        raise ConfigError(f"format={fmt!r} is not known; valid: {', '.join(FORMATS)}")
    if text_mode not in TEXT_MODES:
        raise ConfigError(f"text_mode={text_mode!r} is not known; valid: {', '.join(TEXT_MODES)}")
    for raw in inputs:
        path = Path(raw)
        if not path.exists():
            raise ConfigError(f"input {path} does not exist")
        kind = detect_format(path) if fmt == "auto" else fmt
        if kind == "text":
            yield from _text_docs(path, text_mode, encoding, encoding_errors)
        elif kind == "jsonl":
            for lineno, record in read_jsonl(path, encoding, encoding_errors):
                yield field(record, text_key, f"{path}:{lineno}")
        elif kind == "parquet":
            yield from _parquet_docs(path, text_key)
        else:
            yield from _hf_docs(path, text_key, hf_split)
