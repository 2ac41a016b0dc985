"""Train a byte-level BPE tokenizer offline (``nxd data train-tokenizer``).

Byte-level BPE round-trips any text exactly (every byte has a token), which is what a quickstart
corpus of documentation and source code needs. The output directory is loadable by
:func:`nxd_data.tokenizers.load_tokenizer` and by ``transformers.PreTrainedTokenizerFast``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from nxd.errors import ConfigError
from nxd_data.tokenizers import BOS, CHAT_TOKENS, DEFAULT_CHAT_TEMPLATE, EOS, PAD

SPECIAL_TOKENS = [PAD, BOS, EOS, *CHAT_TOKENS]


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: str | Path, min_frequency: int = 2) -> Path:
    """Train on ``texts`` and write ``tokenizer.json`` + ``tokenizer_config.json`` into ``out_dir``.

    Special tokens get the first ids: ``<|pad|>``=0, ``<|bos|>``=1, ``<|eos|>``=2, then the chat
    markers. Returns ``out_dir``. The files are written under temporary names and renamed, so an
    existing tokenizer there is replaced whole or not at all.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    minimum = 256 + len(SPECIAL_TOKENS)
    if vocab_size < minimum:
        raise ConfigError(f"vocab_size={vocab_size} is too small for byte-level BPE: at least {minimum}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    seen = [0]

    def counted() -> Iterable[str]:
        for text in texts:
            seen[0] += 1
            yield text

    tokenizer.train_from_iterator(counted(), trainer=trainer)
    if seen[0] == 0:
        raise ConfigError("no training text: the tokenizer inputs hold no documents")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "model_max_length": 1_000_000,
        "chat_template": DEFAULT_CHAT_TEMPLATE,
        "nxd_trained_vocab_size": tokenizer.get_vocab_size(with_added_tokens=True),
    }
    _atomic_write(out / "tokenizer.json", tokenizer.to_str(pretty=False))
    _atomic_write(out / "tokenizer_config.json", json.dumps(config, indent=2))
    return out


def short_vocabulary_note(out_dir: str | Path, asked: int, min_frequency: int = 2) -> str:
    """Why a trained vocabulary is smaller than asked ("" when it is not): BPE adds a merge only for a
    pair of tokens the corpus holds at least ``min_frequency`` times, and a small corpus runs out."""
    config = json.loads((Path(out_dir) / "tokenizer_config.json").read_text(encoding="utf-8"))
    got = int(config.get("nxd_trained_vocab_size", asked))
    if got >= asked:
        return ""
    return (f"; vocabulary {got}, not the {asked} asked (--vocab-size): after the 256 bytes and "
            f"{len(SPECIAL_TOKENS)} special tokens the corpus has only {got - 256 - len(SPECIAL_TOKENS)} token pairs "
            f"seen at least {min_frequency} times to merge; give more text for a larger vocabulary")


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)
