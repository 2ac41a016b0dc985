"""``hf`` data module: a Hugging Face dataset saved with ``save_to_disk`` (NxDT's ``HFDataModule``).

The dataset either holds token ids already (``input_ids_key``, e.g. NxDT's pre-tokenized
``wikicorpus_llama3_tokenized_8k``) or text (``text_key``) that ``tokenizer`` encodes once when the
module is built. Samples then come in one of two ways:

- ``packing: rows`` (default for token ids): every row is one sample. A row of ``seq_length + 1``
  tokens is a full window; a row of ``seq_length`` tokens (NxDT's layout, where the HF model
  shifts labels itself) gets its last label masked out, so the loss covers the same
  ``seq_length - 1`` predictions NxDT trains on.
- ``packing: concat`` (default for text): rows in a seeded order are concatenated and cut into
  ``seq_length + 1`` windows at stride ``seq_length``, exactly like the ``indexed`` module.

Batches, DP sharding and exact resume are the ``indexed`` module's (:class:`StreamDataModule`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from nxd.errors import ConfigError
from nxd_data.gpt_dataset import pretraining_sample
from nxd_data.hf_disk import load_saved_dataset
from nxd_data.module import EpochStream, MappedSource, StreamDataModule, begin_build, config_flag
from nxd_data.tokenizers import load_tokenizer

PACKING = ("rows", "concat")


@dataclass
class TokenRows:
    """Rows of token ids as one flat array plus row offsets (``row i = values[offsets[i]:offsets[i+1]]``)."""

    values: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def row(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i] : self.offsets[i + 1]]


def _token_rows_from_column(ds: Any, key: str, where: str) -> TokenRows:
    import pyarrow as pa
    import pyarrow.compute as pc

    column = ds.data.column(key).combine_chunks()
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type) or pa.types.is_fixed_size_list(column.type)) \
            or not pa.types.is_integer(column.type.value_type):
        raise ConfigError(f"{where}: column {key!r} must hold lists of integer token ids, it holds {column.type}")
    lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = column.flatten().to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    if len(values) and values.min() < 0:
        raise ConfigError(f"{where}: column {key!r} holds negative token ids (e.g. -100 padding); store plain ids")
    return TokenRows(values, offsets)


class HFDataModuleFactory:
    """``hf``: pre-tokenized or text Hugging Face datasets saved to disk, rows or concatenated."""

    def _source(self, config: dict, which: str) -> tuple[TokenRows, str, str]:
        """Token rows of ``data.<which>_dir``, the packing mode, and the location for errors."""
        path = config[f"{which}_dir"]
        where = f"data.{which}_dir"
        default_split = "train" if which == "train" else "validation"
        split = config.get(f"{which}_split", default_split)
        ds = load_saved_dataset(path, split, where=where)
        ids_key = config.get("input_ids_key", "input_ids")
        text_key = config.get("text_key", "text")
        if ids_key in ds.column_names:
            rows, default_packing = _token_rows_from_column(ds, ids_key, where), "rows"
        elif text_key in ds.column_names:
            if config.get("tokenizer") is None:
                raise ConfigError(
                    f"data.tokenizer is required: {path} has text column {text_key!r} but no token column {ids_key!r}"
                )
            rows, default_packing = self._tokenize(ds, text_key, config), "concat"
        else:
            raise ConfigError(
                f"{where}: {path} has neither the token column data.input_ids_key={ids_key!r} nor the text column "
                f"data.text_key={text_key!r} (columns: {', '.join(ds.column_names) or 'none'})"
            )
        packing = config.get("packing", default_packing)
        if packing not in PACKING:
            raise ConfigError(f"data.packing={packing!r} is not known; valid: {', '.join(PACKING)}")
        return rows, packing, f"{where} {path}"

    def _tokenize(self, ds: Any, key: str, config: dict) -> TokenRows:
        tok = load_tokenizer(config["tokenizer"])
        add_bos, append_eos = config_flag(config, "add_bos", False), config_flag(config, "append_eos", True)
        if append_eos and tok.eos_id is None:
            raise ConfigError(f"data.tokenizer {tok.path} has no EOS token; set data.append_eos: false")
        if add_bos and tok.bos_id is None:
            raise ConfigError(f"data.tokenizer {tok.path} has no BOS token; set data.add_bos: false")
        encoded: list[list[int]] = []
        for batch in ds.select_columns([key]).iter(batch_size=1024):
            texts = [t for t in batch[key] if t]
            for ids in tok.encode_batch(texts):
                encoded.append(([tok.bos_id] if add_bos else []) + ids + ([tok.eos_id] if append_eos else []))
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=offsets[1:])
        values = np.fromiter((t for e in encoded for t in e), dtype=np.int64, count=int(offsets[-1]))
        return TokenRows(values, offsets)

    @staticmethod
    def _check_rows(rows: TokenRows, seq_length: int, where: str) -> None:
        lengths = rows.lengths()
        bad = np.flatnonzero((lengths != seq_length) & (lengths != seq_length + 1))
        if len(bad):
            i = int(bad[0])
            raise ConfigError(
                f"{where}: with data.packing=rows every row must hold seq_length={seq_length} or seq_length+1="
                f"{seq_length + 1} tokens, but row {i} holds {int(lengths[i])} ({len(bad)} rows differ); "
                "use data.packing: concat for rows of other lengths"
            )

    def validate(self, config: dict) -> None:
        if "train_dir" not in config:
            raise ConfigError("data.train_dir is required for the hf data module: a directory written by save_to_disk")
        for key in ("shuffle", "attention_mask", "add_bos", "append_eos"):
            config_flag(config, key, key != "add_bos")
        seq = config.get("seq_length")
        if seq is not None and (not isinstance(seq, int) or seq <= 0):
            raise ConfigError(f"data.seq_length must be a positive integer, got {seq!r}")
        for which in ("train", "val"):
            if config.get(f"{which}_dir") is None:
                continue
            rows, packing, where = self._source(config, which)
            if len(rows) == 0 or rows.offsets[-1] == 0:
                raise ConfigError(f"{where}: the dataset holds no tokens")
            if seq is not None and packing == "rows":
                self._check_rows(rows, seq, where)
            if seq is not None and packing == "concat" and which == "train" and rows.offsets[-1] < seq + 1:
                raise ConfigError(
                    f"{where}: holds {int(rows.offsets[-1])} tokens, fewer than one sample of seq_length+1={seq + 1}"
                )

    def _samples(self, rows: TokenRows, packing: str, seq_length: int, seed: int, shuffle: bool, pad_id: int,
                 where: str) -> MappedSource:
        if packing == "rows":
            self._check_rows(rows, seq_length, where)

            def row_sample(i: int) -> dict[str, np.ndarray]:
                row = rows.row(i)
                if len(row) == seq_length + 1:
                    return pretraining_sample(row)
                sample = pretraining_sample(np.append(row, pad_id))
                sample["loss_mask"][-1] = 0.0  # the token after the row is unknown
                return sample

            return MappedSource(len(rows), row_sample)
        # concat: rows in a seeded order, cut into overlapping windows (as gpt_dataset does)
        order = np.random.default_rng([seed, 0xD0C5]).permutation(len(rows)) if shuffle else np.arange(len(rows))
        flat = np.concatenate([rows.row(int(i)) for i in order]) if len(rows) else np.zeros(0, np.int64)
        count = max((len(flat) - 1) // seq_length, 0)
        if count == 0:
            raise ConfigError(f"{where}: holds {len(flat)} tokens, fewer than one sample of seq_length+1={seq_length + 1}")
        return MappedSource(count, lambda k: pretraining_sample(flat[k * seq_length : k * seq_length + seq_length + 1]))

    def __call__(
        self, config: dict, *, seq_length: int, micro_batch_size: int, global_batch_size: int,
        dp_rank: int, dp_size: int, seed: int,
    ) -> StreamDataModule:
        begin_build(self, config, ("train_dir",), seq_length=seq_length, micro_batch_size=micro_batch_size,
                    global_batch_size=global_batch_size, dp_rank=dp_rank, dp_size=dp_size)
        shuffle = config_flag(config, "shuffle", True)
        pad_id = config.get("pad_id", 0)
        if not isinstance(pad_id, int) or isinstance(pad_id, bool) or pad_id < 0:
            raise ConfigError(f"data.pad_id must be a non-negative token id, got {pad_id!r}")
        rows, packing, where = self._source(config, "train")
        train = self._samples(rows, packing, seq_length, seed, shuffle, pad_id, where)
        valid = None
        if config.get("val_dir") is not None:
            vrows, vpacking, vwhere = self._source(config, "val")
            valid = self._samples(vrows, vpacking, seq_length, seed, False, pad_id, vwhere)
        info = {"train_dir": str(config["train_dir"]), "packing": packing, "rows": len(rows),
                "tokens": int(rows.offsets[-1]), "train_samples": len(train)}
        return StreamDataModule(
            EpochStream(train, seed, shuffle), valid, seq_length=seq_length, micro_batch_size=micro_batch_size,
            global_batch_size=global_batch_size, dp_rank=dp_rank, dp_size=dp_size, seed=seed,
            attention_mask=config_flag(config, "attention_mask", True), info=info,
        )


hf = HFDataModuleFactory()
