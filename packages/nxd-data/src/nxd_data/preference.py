"""Preference pairs (prompt, chosen, rejected) as NxD Training's DPO/ORPO data reads them.

A record is JSONL (or a row of a Hugging Face dataset saved to disk) with NxDT's / TRL's fields:

* standard: ``{"prompt": str, "chosen": str, "rejected": str}``;
* conversational: ``prompt`` a list of ``{role, content}`` messages and ``chosen`` / ``rejected``
  lists of assistant messages (rendered with the tokenizer's chat template);
* implicit prompt: only ``chosen`` / ``rejected`` conversations; the prompt is their shared leading
  messages (everything before the first assistant reply that differs).

Tokenisation follows TRL's DPO tokeniser that NxDT calls (``trl.trainer.dpo_trainer._tokenize``):
BOS + prompt, response + EOS; when prompt + the longer response exceed ``max_length`` (the
sequence length) the prompt is cut to ``max_prompt_length`` (``truncation_mode`` ``keep_start``
keeps its beginning, ``keep_end`` its end), and if that is still too long the responses are cut to
``max_length - max_prompt_length``. Only response tokens (and their EOS) carry the loss mask.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nxd.errors import ConfigError
from nxd_data.hf_disk import is_saved_dataset, load_saved_dataset
from nxd_data.sft import jsonl_files
from nxd_data.sources import read_jsonl
from nxd_data.tokenizers import Tokenizer

TRUNCATION_MODES = ("keep_start", "keep_end")
RESPONSES = ("chosen", "rejected")


@dataclass
class PreferencePair:
    """Token ids of one pair: the (truncated) prompt and the two (truncated) responses."""

    prompt: np.ndarray
    chosen: np.ndarray
    rejected: np.ndarray


@dataclass
class PreferenceStats:
    pairs: int = 0
    prompt_truncated: int = 0
    response_truncated: int = 0


def iter_records(spec: Any, key: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(where, record)`` for every record of JSONL files/directories or saved HF datasets."""
    items = [spec] if isinstance(spec, (str, Path)) else list(spec)
    for item in items:
        path = Path(item)
        if is_saved_dataset(path):
            ds = load_saved_dataset(path, "train", where=key)
            for i, row in enumerate(ds):
                yield f"{path}[{i}]", dict(row)
            continue
        for file in jsonl_files(path, key):
            for lineno, record in read_jsonl(file):
                yield f"{file}:{lineno}", record


def _messages(value: Any, where: str, name: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(m, dict) and "role" in m and "content" in m for m in value):
        raise ConfigError(f"{where}: field {name!r} must be a string or a list of {{role, content}} messages")
    return value


def _chat_pieces(tok: Tokenizer, prompt: list[dict], response: list[dict]) -> tuple[str, str]:
    """(prompt text, response text) of a conversation rendered with the chat template."""
    pieces = tok.render_chat([*prompt, *response])
    first = next((i for i, (_, trainable) in enumerate(pieces) if trainable), None)
    if first is None:
        raise ConfigError("the response has no assistant message")
    return "".join(t for t, _ in pieces[:first]), "".join(t for t, _ in pieces[first:])


def record_texts(record: dict[str, Any], tok: Tokenizer, where: str) -> tuple[str, str, str]:
    """(prompt, chosen, rejected) texts of a standard, conversational or implicit-prompt record."""
    missing = [k for k in RESPONSES if k not in record]
    if missing:
        raise ConfigError(f"{where}: missing field(s) {', '.join(map(repr, missing))}: a preference record needs "
                          f"'prompt', 'chosen' and 'rejected' (fields present: {', '.join(sorted(record)) or 'none'})")
    prompt, chosen, rejected = record.get("prompt"), record["chosen"], record["rejected"]
    if all(isinstance(v, str) for v in (chosen, rejected)):
        if not isinstance(prompt, str):
            raise ConfigError(f"{where}: 'chosen'/'rejected' are text, so 'prompt' must be text too (got {prompt!r:.60})")
        return prompt, chosen, rejected
    chosen_m, rejected_m = _messages(chosen, where, "chosen"), _messages(rejected, where, "rejected")
    if prompt is None:  # implicit prompt: the shared leading messages
        n = 0
        while n < min(len(chosen_m), len(rejected_m)) and chosen_m[n] == rejected_m[n]:
            n += 1
        while n > 0 and chosen_m[n - 1].get("role") == "assistant":
            n -= 1
        prompt_m, chosen_m, rejected_m = chosen_m[:n], chosen_m[n:], rejected_m[n:]
    elif isinstance(prompt, str):
        prompt_m = [{"role": "user", "content": prompt}]
    else:
        prompt_m = _messages(prompt, where, "prompt")
    try:
        p_text, c_text = _chat_pieces(tok, prompt_m, chosen_m)
        p_text2, r_text = _chat_pieces(tok, prompt_m, rejected_m)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if p_text != p_text2:
        raise ConfigError(f"{where}: chosen and rejected render different prompts with the chat template")
    return p_text, c_text, r_text


def tokenize_pair(
    texts: tuple[str, str, str], tok: Tokenizer, max_length: int, max_prompt_length: int, truncation_mode: str,
    stats: PreferenceStats | None = None,
) -> PreferencePair:
    prompt_t, chosen_t, rejected_t = texts
    prompt = ([tok.bos_id] if tok.bos_id is not None else []) + tok.encode(prompt_t)
    eos = [tok.eos_id] if tok.eos_id is not None else []
    chosen, rejected = tok.encode(chosen_t) + eos, tok.encode(rejected_t) + eos
    longer = max(len(chosen), len(rejected))
    if len(prompt) + longer > max_length:
        if len(prompt) > max_prompt_length and stats is not None:
            stats.prompt_truncated += 1
        prompt = prompt[:max_prompt_length] if truncation_mode == "keep_start" else prompt[-max_prompt_length:]
    if len(prompt) + longer > max_length:
        keep = max_length - max_prompt_length
        chosen, rejected = chosen[:keep], rejected[:keep]
        if stats is not None:
            stats.response_truncated += 1
    return PreferencePair(*(np.asarray(x, dtype=np.int64) for x in (prompt, chosen, rejected)))


def load_pairs(spec: Any, key: str, tok: Tokenizer, *, max_length: int, max_prompt_length: int,
               truncation_mode: str, limit: int | None = None) -> tuple[list[PreferencePair], PreferenceStats]:
    """Tokenise the first ``limit`` records (NxDT's ``dev_choose_samples``), or all of them."""
    stats, pairs = PreferenceStats(), []
    for where, record in iter_records(spec, key):
        if limit is not None and len(pairs) >= limit:
            break
        pair = tokenize_pair(record_texts(record, tok, where), tok, max_length, max_prompt_length,
                             truncation_mode, stats)
        if len(pair.chosen) == 0 or len(pair.rejected) == 0:
            raise ConfigError(f"{where}: an empty response after truncation (max_prompt_length={max_prompt_length} "
                              f"leaves no room in seq_length={max_length})")
        pairs.append(pair)
    if not pairs:
        raise ConfigError(f"{key}: no preference records in {spec}")
    stats.pairs = len(pairs)
    return pairs, stats


def _row(prompt: np.ndarray, response: np.ndarray, seq_length: int, pad_id: int) -> dict[str, np.ndarray]:
    tokens = np.concatenate([prompt, response])
    trainable = np.concatenate([np.zeros(len(prompt), bool), np.ones(len(response), bool)])
    n = len(tokens) - 1
    input_ids = np.full(seq_length, pad_id, dtype=np.int64)
    labels = np.full(seq_length, pad_id, dtype=np.int64)
    loss_mask = np.zeros(seq_length, dtype=np.float32)
    segment_ids = np.zeros(seq_length, dtype=np.int64)
    input_ids[:n], labels[:n], loss_mask[:n], segment_ids[:n] = tokens[:-1], tokens[1:], trainable[1:], 1
    return {"input_ids": input_ids, "labels": labels, "loss_mask": loss_mask,
            "position_ids": np.arange(seq_length, dtype=np.int64), "segment_ids": segment_ids}


class PreferenceSource:
    """Pairs as samples: ``chosen_*`` and ``rejected_*`` rows of ``seq_length`` plus ``example_index``."""

    def __init__(self, pairs: Sequence[PreferencePair], seq_length: int, pad_id: int) -> None:
        self.pairs, self.seq_length, self.pad_id = pairs, seq_length, pad_id

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        pair = self.pairs[i]
        sample: dict[str, np.ndarray] = {"example_index": np.asarray(i, dtype=np.int64)}
        for name in RESPONSES:
            for key, value in _row(pair.prompt, getattr(pair, name), self.seq_length, self.pad_id).items():
                sample[f"{name}_{key}"] = value
        return sample
