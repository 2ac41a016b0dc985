"""The ``preference`` data module: DP-sharded pairs, chosen and rejected rows in one batch.

A micro-batch of ``m`` pairs is ``[2m, seq_length]``: rows ``0..m-1`` are the chosen responses,
rows ``m..2m-1`` the rejected ones of the same pairs (NxDT's "the batch is doubled"), with
``input_ids``, ``labels``, ``loss_mask`` (responses only), ``position_ids`` and ``segment_ids``
(1 on real tokens, 0 on padding), plus ``example_index`` ``[m]``. Sampling, shuffling and the
resume position are :class:`~nxd_data.module.StreamDataModule`'s.

Reference log-probabilities (DPO's ``precompute_ref_log_probs``) are kept here, per example, and
added to each batch as ``reference_chosen_logps`` / ``reference_rejected_logps``; they are part of
``state_dict()``, so a resumed run uses the values computed before its first step, not ones
recomputed from a model that has since trained.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from nxd.errors import ConfigError
from nxd_data.module import EpochStream, StreamDataModule, begin_build
from nxd_data.preference import RESPONSES, PreferenceSource
from nxd_data.sources import dev_choose_samples

#: splits a reference can be computed for
SPLITS = ("train", "valid")


def collate_pairs(samples: Sequence[dict[str, np.ndarray]]) -> dict[str, torch.Tensor]:
    batch: dict[str, torch.Tensor] = {}
    for key in ("input_ids", "labels", "loss_mask", "position_ids", "segment_ids"):
        rows = [s[f"{name}_{key}"] for name in RESPONSES for s in samples]
        batch[key] = torch.from_numpy(np.stack(rows))
    batch["example_index"] = torch.from_numpy(np.stack([s["example_index"] for s in samples]))
    return batch


class PreferenceDataModule(StreamDataModule):
    def __init__(self, train: PreferenceSource, valid: PreferenceSource | None, *, shuffle: bool, **kwargs: Any) -> None:
        super().__init__(EpochStream(train, kwargs["seed"], shuffle), valid, attention_mask=False, **kwargs)
        self.sources = {"train": train, "valid": valid}
        self.reference_logps: dict[str, np.ndarray] = {}

    # -------------------------------------------------------------- batches
    def _with_reference(self, batch: dict[str, torch.Tensor], split: str) -> dict[str, torch.Tensor]:
        ref = self.reference_logps.get(split)
        if ref is not None:
            picked = torch.from_numpy(ref[batch["example_index"].numpy()])
            batch["reference_chosen_logps"], batch["reference_rejected_logps"] = picked[:, 0], picked[:, 1]
        return batch

    def train_batches(self) -> Iterator[dict[str, torch.Tensor]]:
        while True:
            indices = self.rank_indices(self.consumed_samples)
            batch = collate_pairs([self.train_stream[i] for i in indices])
            self.consumed_samples += self.chunk
            yield self._with_reference(batch, "train")

    def valid_batches(self) -> Iterator[dict[str, torch.Tensor]]:
        if self.valid_source is None:
            return
        for start in range(0, len(self.valid_source) - self.chunk + 1, self.chunk):
            yield self._with_reference(collate_pairs([self.valid_source[i] for i in self.rank_indices(start)]), "valid")

    def reference_batches(self, split: str = "train") -> Iterator[dict[str, torch.Tensor]]:
        """This DP rank's share of every example of ``split``, in source order (no shuffling), for
        computing reference log-probs once. Every rank yields the same number of batches (the last
        ones repeat the final example), so collectives inside the loop stay matched."""
        source = self.sources[split]
        if source is None:
            return
        n = len(source)
        for start in range(0, n, self.chunk):
            indices = [min(i, n - 1) for i in self.rank_indices(start)]
            yield collate_pairs([source[i] for i in indices])

    def set_reference_logps(self, split: str, values: np.ndarray) -> None:
        """``values[i] = (chosen, rejected)`` reference log-probs of example ``i`` of ``split``."""
        source = self.sources[split]
        values = np.asarray(values, dtype=np.float64)
        if source is None or values.shape != (len(source), 2):
            raise ConfigError(f"reference log-probs for the {split} split must have shape "
                              f"({0 if source is None else len(source)}, 2), got {values.shape}")
        self.reference_logps[split] = values

    # -------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["pairs"] = {k: (0 if s is None else len(s)) for k, s in self.sources.items()}
        state["reference_logps"] = {k: torch.from_numpy(v.copy()) for k, v in self.reference_logps.items()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state.get("pairs", {})
        for split, n in saved.items():
            have = 0 if self.sources.get(split) is None else len(self.sources[split])
            if n != have:
                raise ConfigError(f"data state was saved with {n} {split} preference pairs, this run has {have}: "
                                  "the data (or dev_choose_samples) changed, so the position cannot continue")
        super().load_state_dict(state)
        self.reference_logps = {}
        for split, values in (state.get("reference_logps") or {}).items():
            self.set_reference_logps(split, torch.as_tensor(values).numpy())


class PreferenceDataModuleFactory:
    """``preference``: prompt/chosen/rejected records (JSONL or saved HF datasets), for DPO/ORPO.

    Keys (the YAML ``data`` section; the DPO/ORPO workflow adds its ``max_prompt_length`` and
    ``truncation_mode``): ``train_dir``, ``val_dir``, ``dev_choose_samples``, ``tokenizer``,
    ``seq_length``, ``max_prompt_length`` (default ``seq_length // 2``), ``truncation_mode``
    (``keep_start``/``keep_end``), ``shuffle``.
    """

    def _options(self, config: dict) -> dict[str, Any]:
        from nxd_data.preference import TRUNCATION_MODES

        seq = config.get("seq_length")
        if not isinstance(seq, int) or seq < 2:
            raise ConfigError(f"data.seq_length must be an integer >= 2 for preference data, got {seq!r}")
        max_prompt = config.get("max_prompt_length", seq // 2)
        if not isinstance(max_prompt, int) or not 0 < max_prompt < seq:
            raise ConfigError(f"max_prompt_length={max_prompt!r} (model_alignment_strategy.<dpo|orpo>.max_prompt_length) "
                              f"must be a positive integer below seq_length={seq} (prompt + response share seq_length)")
        mode = config.get("truncation_mode", "keep_start")
        if mode not in TRUNCATION_MODES:
            raise ConfigError(f"truncation_mode={mode!r}: valid values are {', '.join(TRUNCATION_MODES)}")
        limit = dev_choose_samples(config)
        shuffle = config.get("shuffle", True)
        if not isinstance(shuffle, bool):
            raise ConfigError(f"data.shuffle must be true or false, got {shuffle!r}")
        return {"max_length": seq, "max_prompt_length": max_prompt, "truncation_mode": mode, "limit": limit,
                "shuffle": shuffle}

    def _load(self, config: dict) -> tuple[Any, dict[str, Any]]:
        from nxd_data.preference import load_pairs
        from nxd_data.tokenizers import load_tokenizer

        if config.get("train_dir") is None:
            raise ConfigError("data.train_dir is required for preference data: a JSONL file/directory or a saved "
                              "HF dataset of prompt/chosen/rejected records")
        if config.get("tokenizer") is None:
            raise ConfigError("data.tokenizer is required for preference data: the model's tokenizer path")
        opts = self._options(config)
        tok = load_tokenizer(config["tokenizer"])
        keys = {k: opts[k] for k in ("max_length", "max_prompt_length", "truncation_mode", "limit")}
        pairs = {split: load_pairs(config[key], f"data.{key}", tok, **keys)[0]
                 for split, key in (("train", "train_dir"), ("valid", "val_dir")) if config.get(key) is not None}
        pad_id = next((i for i in (tok.pad_id, tok.eos_id, 0) if i is not None), 0)
        return pairs, {**opts, "pad_id": pad_id}

    def validate(self, config: dict) -> None:
        self._load(config)

    def __call__(
        self, config: dict, *, seq_length: int, micro_batch_size: int, global_batch_size: int,
        dp_rank: int, dp_size: int, seed: int,
    ) -> PreferenceDataModule:
        config = {"seq_length": seq_length, **config}
        begin_build(self, config, None, seq_length=seq_length, micro_batch_size=micro_batch_size,
                    global_batch_size=global_batch_size, dp_rank=dp_rank, dp_size=dp_size)
        pairs, opts = self._load(config)
        train = PreferenceSource(pairs["train"], seq_length, opts["pad_id"])
        valid = PreferenceSource(pairs["valid"], seq_length, opts["pad_id"]) if "valid" in pairs else None
        module = PreferenceDataModule(
            train, valid, shuffle=opts["shuffle"], seq_length=seq_length, micro_batch_size=micro_batch_size,
            global_batch_size=global_batch_size, dp_rank=dp_rank, dp_size=dp_size, seed=seed,
        )
        module.info = {"datasets": [{"train_samples": len(train)}], "pairs": len(train)}
        return module


preference = PreferenceDataModuleFactory()
