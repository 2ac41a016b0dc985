"""Data module factories registered by name: ``indexed`` (pretraining) and ``sft``.

Each factory is called as in :class:`nxd.specs.DataModuleFactory` and has ``validate(config)``,
which the trainer runs before launching ranks; it raises :class:`nxd.ConfigError` naming the key.
``config`` is the YAML ``data`` section (NxDT key names where NxDT has them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from nxd.errors import ConfigError
from nxd_data.gpt_dataset import GPTSamples, parse_splits, pretraining_sample, split_ranges
from nxd_data.indexed import IndexedDataset
from nxd_data.module import (
    BlendedStream,
    ConcatSource,
    EpochStream,
    MappedSource,
    StreamDataModule,
    begin_build,
    config_flag,
)
from nxd_data.prepare import read_metadata
from nxd_data.sft import SFTSource, jsonl_files, load_examples, pack
from nxd_data.sources import dev_choose_samples, read_jsonl
from nxd_data.tokenizers import load_tokenizer

SPLITS = ("train", "validation", "test")

#: Megatron data keys of NxDT's megatron configs -> (the one value nxd's indexed module behaves
#: as, why): another value would change the samples or their order, so it is refused
MEGATRON_VALUES: dict[str, tuple[Any, str]] = {
    "data_impl": ("mmap", "nxd reads Megatron's memory-mapped .bin/.idx datasets"),
    "dataloader_type": ("single", "nxd's sampler is Megatron's sequential 'single' sampler"),
    "no_seqlen_plus_one_input_tokens": (False, "each sample holds seq_length+1 tokens (inputs and shifted labels)"),
    "pad_samples_to_global_batch_size": (False, "training batches are always whole"),
    "validation_drop_last": (True, "validation uses whole micro-batches only"),
}


def parse_blend(value: Any, key: str = "data_prefix") -> list[tuple[float, str]]:
    """``"path"``, ``["path", ...]`` (equal weights) or ``[w1, "p1", w2, "p2", ...]``."""
    if isinstance(value, (str, Path)):
        return [(1.0, str(value))]
    if not isinstance(value, (list, tuple)) or not value:
        raise ConfigError(f"data.{key} must be a path, a list of paths, or [weight, path, ...]; got {value!r}")
    if all(isinstance(v, (str, Path)) for v in value):
        return [(1.0, str(v)) for v in value]
    if len(value) % 2 or not all(
        isinstance(w, (int, float)) and not isinstance(w, bool) and isinstance(p, (str, Path))
        for w, p in zip(value[::2], value[1::2])
    ):
        raise ConfigError(f"data.{key}: a weighted blend alternates numbers and paths: [0.7, 'a', 0.3, 'b']; got {value!r}")
    blend = [(float(w), str(p)) for w, p in zip(value[::2], value[1::2])]
    if any(w < 0 for w, _ in blend) or sum(w for w, _ in blend) <= 0:
        raise ConfigError(f"data.{key}: weights must be non-negative with a positive sum; got {value!r}")
    return blend


def parse_prefix(config: dict) -> dict[str, list[tuple[float, str]]] | list[tuple[float, str]]:
    """A blend used with ``splits_string``, or an explicit blend per split (dict form)."""
    if "data_prefix" not in config:
        raise ConfigError("data.data_prefix is required: the prefix of a dataset made by `nxd data prepare`")
    value = config["data_prefix"]
    if isinstance(value, dict):
        unknown = set(value) - set(SPLITS)
        if unknown or "train" not in value:
            raise ConfigError(f"data.data_prefix as a mapping needs 'train' (and optionally 'validation', 'test'); got keys {sorted(value)}")
        return {k: parse_blend(v, f"data_prefix.{k}") for k, v in value.items()}
    return parse_blend(value)


class IndexedDataModuleFactory:
    """``indexed``: Megatron-style pretraining over ``.bin/.idx`` datasets (blends, splits)."""

    def validate(self, config: dict) -> None:
        parsed = parse_prefix(config)
        splits = config.get("splits_string", "980,10,10")
        if not isinstance(parsed, dict):
            parse_splits(splits)
        for key in ("shuffle", "reset_position_ids", "reset_attention_mask", "eod_mask_loss"):
            config_flag(config, key, False)
        for key, (value, why) in MEGATRON_VALUES.items():
            if key in config and config[key] != value:
                raise ConfigError(f"data.{key}={config[key]!r} is not supported: {why} ({key}={value!r})")
        seq = config.get("seq_length")
        if seq is not None and (not isinstance(seq, int) or seq <= 0):
            raise ConfigError(f"data.seq_length must be a positive integer, got {seq!r}")
        train = parsed["train"] if isinstance(parsed, dict) else parsed
        for _, prefix in train:
            ds = IndexedDataset(prefix)
            lo, hi = (0, len(ds)) if isinstance(parsed, dict) else split_ranges(splits, len(ds))[0]
            tokens = int(ds.sizes[lo:hi].astype(np.int64).sum())
            if tokens == 0:
                raise ConfigError(f"data.data_prefix {prefix}: the train split is empty (splits_string={splits!r})")
            if seq is not None and tokens < seq + 1:
                raise ConfigError(
                    f"data.seq_length={seq} is larger than the train split of {prefix} allows: it holds "
                    f"{tokens} tokens and one sample needs seq_length+1={seq + 1}"
                )
        if isinstance(parsed, dict):
            for split in ("validation", "test"):
                for _, prefix in parsed.get(split, []):
                    IndexedDataset(prefix)

    def __call__(
        self, config: dict, *, seq_length: int, micro_batch_size: int, global_batch_size: int,
        dp_rank: int, dp_size: int, seed: int,
    ) -> StreamDataModule:
        config = {"seq_length": seq_length, **config}
        begin_build(self, config, (), seq_length=seq_length, micro_batch_size=micro_batch_size,
                    global_batch_size=global_batch_size, dp_rank=dp_rank, dp_size=dp_size)
        parsed = parse_prefix(config)
        splits = config.get("splits_string", "980,10,10")
        shuffle = config_flag(config, "shuffle", True)
        options = {k: config_flag(config, k, False) for k in ("reset_position_ids", "reset_attention_mask", "eod_mask_loss")}

        def samples(prefix: str, split: int, explicit: bool) -> tuple[GPTSamples, int | None]:
            eos = config.get("eos_id", read_metadata(prefix).get("eos_id"))
            if any(options.values()) and eos is None:  # refused before the index is built
                raise ConfigError(f"data.eos_id is needed for reset_position_ids/reset_attention_mask/eod_mask_loss ({prefix} has no metadata)")
            ds = IndexedDataset(prefix)
            doc_range = (0, len(ds)) if explicit else split_ranges(splits, len(ds))[split]
            cache = config.get("index_mapping_dir") or str(Path(prefix).parent / "index_cache")
            gs = GPTSamples(ds, doc_range, seq_length, seed, shuffle_docs=shuffle, cache_dir=cache, name=SPLITS[split])
            return gs, eos

        def source(gs: GPTSamples, eos: int | None) -> MappedSource:
            return MappedSource(len(gs), lambda i: pretraining_sample(gs.window(i), eos, **options))

        def blend_for(split: int) -> list[tuple[float, str]]:
            if isinstance(parsed, dict):
                return parsed.get(SPLITS[split], [])
            return parsed

        explicit = isinstance(parsed, dict)
        streams, weights, info = [], [], {"datasets": []}
        for k, (weight, prefix) in enumerate(blend_for(0)):
            gs, eos = samples(prefix, 0, explicit)
            if len(gs) == 0:
                raise ConfigError(
                    f"data.seq_length={seq_length}: the train split of {prefix} has {gs.num_tokens} tokens, "
                    f"not enough for one sample of seq_length+1={seq_length + 1}"
                )
            streams.append(EpochStream(source(gs, eos), seed + 7919 * k, shuffle))
            weights.append(weight)
            info["datasets"].append({"prefix": prefix, "weight": weight, "train_samples": len(gs)})
        train = streams[0] if len(streams) == 1 else BlendedStream(streams, weights)
        valid_parts = []
        for _, prefix in blend_for(1):
            gs, eos = samples(prefix, 1, explicit)
            if len(gs):
                valid_parts.append(source(gs, eos))
        valid = ConcatSource(valid_parts) if valid_parts else None
        return StreamDataModule(
            train, valid, seq_length=seq_length, micro_batch_size=micro_batch_size,
            global_batch_size=global_batch_size, dp_rank=dp_rank, dp_size=dp_size, seed=seed,
            attention_mask=config_flag(config, "attention_mask", True), info=info,
        )


class SFTDataModuleFactory:
    """``sft``: JSONL prompt/completion or chat messages, packed (default) or padded."""

    def _keys(self, config: dict) -> dict[str, Any]:
        keys = {
            "prompt_key": config.get("prompt_key", "prompt"),
            "completion_key": config.get("completion_key", "completion"),
            "messages_key": config.get("messages_key", "messages"),
            "add_bos": config_flag(config, "add_bos", True),
        }
        return keys

    def validate(self, config: dict) -> None:
        if "train_dir" not in config:
            raise ConfigError("data.train_dir is required for the sft data module: a JSONL file or directory")
        if "tokenizer" not in config:
            raise ConfigError("data.tokenizer is required for the sft data module: a tokenizer.json/.model path")
        for key in ("packing", "shuffle", "attention_mask"):
            config_flag(config, key, True)
        self._keys(config)
        dev_choose_samples(config)
        load_tokenizer(config["tokenizer"])
        for key in ("train_dir", "val_dir"):
            if config.get(key) is not None:
                for path in jsonl_files(config[key], f"data.{key}"):
                    for _ in read_jsonl(path):  # malformed lines surface here, with file:line
                        pass

    def __call__(
        self, config: dict, *, seq_length: int, micro_batch_size: int, global_batch_size: int,
        dp_rank: int, dp_size: int, seed: int,
    ) -> StreamDataModule:
        begin_build(self, config, ("train_dir", "tokenizer"), seq_length=seq_length, micro_batch_size=micro_batch_size,
                    global_batch_size=global_batch_size, dp_rank=dp_rank, dp_size=dp_size)
        tok = load_tokenizer(config["tokenizer"])
        pad_id = next((i for i in (tok.pad_id, tok.eos_id, 0) if i is not None), 0)
        packing = config_flag(config, "packing", True)
        keys = self._keys(config)

        def build(key: str, order_seed: int) -> tuple[SFTSource, Any]:
            examples, stats = load_examples(jsonl_files(config[key], f"data.{key}"), tok, seq_length,
                                            limit=dev_choose_samples(config), **keys)
            if packing:
                order = np.random.default_rng([order_seed, 0x9AC]).permutation(len(examples))
                rows = pack(examples, seq_length, order)
            else:
                rows = [[i] for i in range(len(examples))]
            return SFTSource(examples, rows, seq_length, pad_id), stats

        train, stats = build("train_dir", seed)
        valid = build("val_dir", seed)[0] if config.get("val_dir") else None
        info = {"examples": stats.examples, "truncated": stats.truncated,
                "dropped_no_target": stats.dropped_no_target, "rows": len(train), "packing": packing}
        return StreamDataModule(
            EpochStream(train, seed, config_flag(config, "shuffle", True)), valid, seq_length=seq_length,
            micro_batch_size=micro_batch_size, global_batch_size=global_batch_size, dp_rank=dp_rank,
            dp_size=dp_size, seed=seed, attention_mask=config_flag(config, "attention_mask", True), info=info,
        )


indexed = IndexedDataModuleFactory()
sft = SFTDataModuleFactory()
