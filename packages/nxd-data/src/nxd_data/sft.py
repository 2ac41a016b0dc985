"""SFT examples from JSONL: ``prompt``/``completion`` records or chat ``messages``.

An example becomes tokens ``t`` with a per-token "trainable" flag (completion / assistant reply
tokens and the final EOS). As a sample: ``input_ids = t[:-1]``, ``labels = t[1:]``,
``loss_mask = trainable[1:]``, ``position_ids = 0..n-2``. Packing concatenates whole examples
into rows of ``seq_length`` (``segment_ids`` 1..k tell them apart, positions restart per
example); padding gives every example its own row. Pad positions have ``segment_ids == 0``,
``loss_mask == 0`` and the pad id as input and label.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nxd.errors import ConfigError
from nxd_data.sources import field, read_jsonl
from nxd_data.tokenizers import Tokenizer


@dataclass
class Example:
    tokens: np.ndarray  # int64 [n]
    trainable: np.ndarray  # bool [n]


@dataclass
class SFTStats:
    examples: int = 0
    truncated: int = 0
    dropped_no_target: int = 0


def jsonl_files(spec: str | Path | Sequence[str | Path], key: str) -> list[Path]:
    """A file, a directory of ``*.jsonl``/``*.json``, or a list of those."""
    items = [spec] if isinstance(spec, (str, Path)) else list(spec)
    files: list[Path] = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            found = sorted(q for q in p.iterdir() if q.suffix in (".jsonl", ".json"))
            if not found:
                raise ConfigError(f"{key}: directory {p} holds no .jsonl files")
            files += found
        elif p.is_file():
            files.append(p)
        else:
            raise ConfigError(f"{key}: {p} does not exist")
    return files


def tokenize_record(
    record: dict[str, Any],
    tok: Tokenizer,
    where: str,
    *,
    prompt_key: str = "prompt",
    completion_key: str = "completion",
    messages_key: str = "messages",
    add_bos: bool = True,
) -> Example:
    if messages_key in record:
        messages = record[messages_key]
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ConfigError(f"{where}: field {messages_key!r} must be a list of {{role, content}} objects")
        for i, m in enumerate(messages):
            field(m, "role", f"{where}: {messages_key}[{i}]")
            field(m, "content", f"{where}: {messages_key}[{i}]")
        if not any(m["role"] == "assistant" for m in messages):
            raise ConfigError(f"{where}: {messages_key} has no 'assistant' message to train on")
        pieces = tok.render_chat(messages)
    elif prompt_key in record or completion_key in record:
        pieces = [(field(record, prompt_key, where), False), (field(record, completion_key, where), True)]
    elif "input" in record or "output" in record:  # NxD Training's SFT records
        pieces = [(field(record, "input", where), False), (field(record, "output", where), True)]
    else:
        raise ConfigError(
            f"{where}: missing fields: need {prompt_key!r} and {completion_key!r} (NxD Training: 'input' and "
            f"'output'), or {messages_key!r} "
            f"(fields present: {', '.join(sorted(record)) or 'none'})"
        )
    ids: list[int] = []
    flags: list[bool] = []
    if add_bos and tok.bos_id is not None:
        ids.append(tok.bos_id)
        flags.append(False)
    for text, trainable in pieces:
        piece = tok.encode(text)
        ids += piece
        flags += [trainable] * len(piece)
    if tok.eos_id is not None and (not ids or ids[-1] != tok.eos_id):
        ids.append(tok.eos_id)
        flags.append(True)  # the model must learn to stop
    return Example(np.asarray(ids, dtype=np.int64), np.asarray(flags, dtype=bool))


def load_examples(files: Sequence[Path], tok: Tokenizer, seq_length: int, limit: int | None = None,
                  **keys: Any) -> tuple[list[Example], SFTStats]:
    """Tokenize every record (the first ``limit`` records: NxDT's ``dev_choose_samples``); truncate
    to ``seq_length + 1`` tokens; drop examples left with no trainable label (they would contribute
    nothing, and an all-masked row divides by zero)."""
    stats = SFTStats()
    examples = []
    records = ((path, lineno, record) for path in files for lineno, record in read_jsonl(path))
    for n, (path, lineno, record) in enumerate(records):
        if limit is not None and n >= limit:
            break
        ex = tokenize_record(record, tok, f"{path}:{lineno}", **keys)
        stats.examples += 1
        if len(ex.tokens) > seq_length + 1:
            stats.truncated += 1
            ex = Example(ex.tokens[: seq_length + 1], ex.trainable[: seq_length + 1])
        if len(ex.tokens) < 2 or not ex.trainable[1:].any():
            stats.dropped_no_target += 1
            continue
        examples.append(ex)
    if not examples:
        raise ConfigError(f"empty SFT dataset: no usable examples in {', '.join(map(str, files))}")
    return examples, stats


def pack(examples: Sequence[Example], seq_length: int, order: np.ndarray) -> list[list[int]]:
    """Greedy sequential packing in ``order``: a row is closed when the next example does not fit."""
    rows: list[list[int]] = []
    row: list[int] = []
    used = 0
    for i in order:
        n = len(examples[i].tokens) - 1
        if row and used + n > seq_length:
            rows.append(row)
            row, used = [], 0
        row.append(int(i))
        used += n
    if row:
        rows.append(row)
    return rows


class SFTSource:
    """Rows of (packed or padded) examples as sample dicts."""

    def __init__(self, examples: Sequence[Example], rows: list[list[int]], seq_length: int, pad_id: int) -> None:
        self.examples, self.rows, self.seq_length, self.pad_id = examples, rows, seq_length, pad_id

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        s = self.seq_length
        input_ids = np.full(s, self.pad_id, dtype=np.int64)
        labels = np.full(s, self.pad_id, dtype=np.int64)
        loss_mask = np.zeros(s, dtype=np.float32)
        position_ids = np.zeros(s, dtype=np.int64)
        segment_ids = np.zeros(s, dtype=np.int64)
        at = 0
        for k, e in enumerate(self.rows[i], start=1):
            ex = self.examples[e]
            n = len(ex.tokens) - 1
            input_ids[at : at + n] = ex.tokens[:-1]
            labels[at : at + n] = ex.tokens[1:]
            loss_mask[at : at + n] = ex.trainable[1:]
            position_ids[at : at + n] = np.arange(n)
            segment_ids[at : at + n] = k
            at += n
        position_ids[at:] = np.arange(s - at)  # padding: harmless distinct positions
        return {"input_ids": input_ids, "labels": labels, "loss_mask": loss_mask,
                "position_ids": position_ids, "segment_ids": segment_ids}
