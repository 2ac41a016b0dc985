"""Tokenizer loading, round trips, special ids, chat rendering, and errors."""

from __future__ import annotations

from pathlib import Path

import mistral_common
import pytest

from nxd.errors import ConfigError
from nxd_data.tokenizers import load_tokenizer

LLAMA_SP = Path(mistral_common.__file__).parent / "data" / "tokenizer.model.v1"
TEXTS = ["Hello, world!", "  leading spaces\nand\ttabs", "unicode: żółć 漢字 🙂", "def f(x):\n    return x ** 2\n"]


def test_trained_bpe_round_trips_any_text(tok_dir: Path) -> None:
    tok = load_tokenizer(tok_dir)
    assert tok.vocab_size == 512
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    for text in TEXTS:
        ids = tok.encode(text)
        assert tok.bos_id not in ids and tok.eos_id not in ids
        assert tok.decode(ids) == text


def test_trained_bpe_matches_transformers(tok_dir: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    ours = load_tokenizer(tok_dir / "tokenizer.json")
    hf = PreTrainedTokenizerFast(tokenizer_file=str(tok_dir / "tokenizer.json"), eos_token="<|eos|>")
    for text in TEXTS:
        assert ours.encode(text) == hf(text, add_special_tokens=False)["input_ids"]
    assert ours.eos_id == hf.eos_token_id


def test_sentencepiece_llama_model() -> None:
    tok = load_tokenizer(LLAMA_SP)
    # Llama/Mistral v1 SentencePiece vocabulary: 32000 pieces, <s>=1, </s>=2, no pad piece
    assert (tok.vocab_size, tok.bos_id, tok.eos_id, tok.pad_id) == (32000, 1, 2, None)
    for text in TEXTS[:2] + TEXTS[3:]:
        assert tok.decode(tok.encode(text)) == text
    assert tok.decode([1, *tok.encode("hi"), 2]) == "<s>hi</s>"
    assert tok.decode([1, *tok.encode("hi"), 2], skip_special_tokens=True) == "hi"


def test_chat_rendering_marks_only_assistant_replies(tok_dir: Path) -> None:
    tok = load_tokenizer(tok_dir)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "3+3?"},
        {"role": "assistant", "content": "6"},
    ]
    pieces = tok.render_chat(messages)
    assert [t for t, trainable in pieces if trainable] == ["4<|end|>\n", "6<|end|>\n"]
    assert "".join(t for t, _ in pieces) == (
        "<|system|>\nBe brief.<|end|>\n<|user|>\n2+2?<|end|>\n<|assistant|>\n4<|end|>\n"
        "<|user|>\n3+3?<|end|>\n<|assistant|>\n6<|end|>\n"
    )


def test_load_errors_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_tokenizer(tmp_path / "nope.json")
    with pytest.raises(ConfigError, match="neither tokenizer.json nor tokenizer.model"):
        load_tokenizer(tmp_path)
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"not": "a tokenizer"}')
    with pytest.raises(ConfigError, match="not a Hugging Face tokenizer.json"):
        load_tokenizer(bad)
    junk = tmp_path / "junk.model"
    junk.write_bytes(b"\x00\x01garbage")
    with pytest.raises(ConfigError, match="junk.model"):
        load_tokenizer(junk)
