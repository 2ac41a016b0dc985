"""Load a tokenizer from a local path: Hugging Face ``tokenizer.json`` or SentencePiece ``.model``.

Both kinds are wrapped in one interface (:class:`Tokenizer`): ``encode`` never adds special tokens
(callers add BOS/EOS explicitly, so pretraining and SFT control them), ``decode`` keeps them
unless asked otherwise, and ``render_chat`` turns chat ``messages`` into text pieces with the
tokenizer's chat template so SFT can mask everything but the assistant's replies.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nxd.errors import ConfigError

#: special tokens of tokenizers trained by ``nxd data train-tokenizer``
PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|eos|>"
CHAT_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
# the template our own tokenizers ship; the same format is the fallback for tokenizers without one
DEFAULT_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
_EOS_GUESSES = ("<|eos|>", "</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|im_end|>")
_BOS_GUESSES = ("<|bos|>", "<s>", "<|begin_of_text|>", "<bos>")
_PAD_GUESSES = ("<|pad|>", "<pad>", "[PAD]", "<|finetune_right_pad_id|>")


class Tokenizer:
    """Common interface of every tokenizer nxd-data loads."""

    vocab_size: int
    eos_id: int | None
    bos_id: int | None
    pad_id: int | None
    chat_template: str | None = None
    path: str = ""

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without any special token added."""
        raise NotImplementedError

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        raise NotImplementedError

    def token_to_id(self, token: str) -> int | None:
        raise NotImplementedError

    @property
    def bos_token(self) -> str:
        return "" if self.bos_id is None else self.decode([self.bos_id])

    @property
    def eos_token(self) -> str:
        return "" if self.eos_id is None else self.decode([self.eos_id])

    def render_chat(self, messages: Sequence[dict[str, Any]]) -> list[tuple[str, bool]]:
        """Split the chat rendering of ``messages`` into ``(text, is_assistant_reply)`` pieces.

        Rendering is incremental: the prompt before assistant turn ``i`` is the template applied
        to ``messages[:i]`` with the generation prompt, and the reply is what rendering
        ``messages[:i+1]`` adds on top. A template that does not render prefixes consistently
        (rare) is reported instead of silently mis-masking.
        """
        pieces: list[tuple[str, bool]] = []
        done = ""
        for i, message in enumerate(messages):
            if message.get("role") != "assistant":
                continue
            prompt = self._render(messages[:i], add_generation_prompt=True)
            full = self._render(messages[: i + 1], add_generation_prompt=False)
            if not prompt.startswith(done) or not full.startswith(prompt):
                raise ConfigError(
                    "the tokenizer's chat template does not render message prefixes consistently; "
                    "SFT needs prefix-stable templates to mask prompts"
                )
            if prompt != done:
                pieces.append((prompt[len(done):], False))
            pieces.append((full[len(prompt):], True))
            done = full
        rest = self._render(list(messages), add_generation_prompt=False)
        if rest != done:
            pieces.append((rest[len(done):], False))
        return pieces

    def _render(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool) -> str:
        if not messages and not add_generation_prompt:
            return ""
        template = self.chat_template or DEFAULT_CHAT_TEMPLATE
        return _jinja_template(template).render(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )


_TEMPLATES: dict[str, Any] = {}


def _jinja_template(source: str) -> Any:
    if source not in _TEMPLATES:
        try:
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError as exc:  # pragma: no cover - jinja2 is a dependency
            raise ConfigError("rendering chat templates needs jinja2: pip install jinja2") from exc

        def raise_exception(message: str) -> None:
            raise ConfigError(f"chat template: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        _TEMPLATES[source] = env.from_string(source)
    return _TEMPLATES[source]


class HFTokenizer(Tokenizer):
    """A Hugging Face ``tokenizers`` tokenizer from ``tokenizer.json`` (+ ``tokenizer_config.json``)."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer as RustTokenizer

        path = Path(path)
        try:
            tok = RustTokenizer.from_file(str(path))
        except Exception as exc:  # noqa: BLE001 - the Rust error text is the useful part
            raise ConfigError(f"{path} is not a Hugging Face tokenizer.json: {exc}") from exc
        self._setup(tok, str(path), _read_json(path.parent / "tokenizer_config.json") or {},
                    _read_json(path.parent / "special_tokens_map.json") or {})

    def _setup(self, tok: Any, path: str, config: dict, special: dict) -> None:
        self._tok, self.path = tok, path
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.eos_id = self._special_id("eos_token", config, special, _EOS_GUESSES)
        self.bos_id = self._special_id("bos_token", config, special, _BOS_GUESSES)
        self.pad_id = self._special_id("pad_token", config, special, _PAD_GUESSES)
        template = config.get("chat_template")
        self.chat_template = template if isinstance(template, str) else None

    def _special_id(self, key: str, config: dict, special: dict, guesses: tuple[str, ...]) -> int | None:
        for source in (config, special):
            value = source.get(key)
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str) and self._tok.token_to_id(value) is not None:
                return self._tok.token_to_id(value)
        for token in guesses:
            if self._tok.token_to_id(token) is not None:
                return self._tok.token_to_id(token)
        return None

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)


class GPT2BPETokenizer(HFTokenizer):
    """Megatron's ``GPT2BPETokenizer`` (NxD Training's ``data.tokenizer.type`` with ``library:
    megatron``): GPT-2's byte-level BPE from its ``vocab.json`` and ``merges.txt`` (``vocab_file``,
    ``merge_file``). Its vocabulary is vocab.json's entries (Megatron's ``len(encoder)``);
    ``<|endoftext|>`` is end of text."""

    def __init__(self, vocab_file: str | Path, merge_file: str | Path) -> None:
        from tokenizers import Tokenizer as RustTokenizer
        from tokenizers import decoders, models, pre_tokenizers

        try:
            tok = RustTokenizer(models.BPE.from_file(str(vocab_file), str(merge_file)))
        except Exception as exc:  # noqa: BLE001 - the Rust error text is the useful part
            raise ConfigError(f"data.tokenizer: {vocab_file} and {merge_file} are not GPT-2 BPE files: {exc}") from exc
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        self._setup(tok, str(vocab_file), {"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"}, {})


#: NxD Training's tokenizer types that name a tokenizer built from files (data.tokenizer.<key>), not a path
FILE_TOKENIZERS = {"GPT2BPETokenizer": ("vocab_file", "merge_file")}


def _from_files(section: dict) -> Tokenizer:
    """An NxDT ``data.tokenizer`` section whose ``type`` is in :data:`FILE_TOKENIZERS`: its files
    must be given and exist (the model's vocabulary comes from them)."""
    kind = section["type"]
    paths = []
    for key in FILE_TOKENIZERS[kind]:
        value = section.get(key)
        if not value:
            raise ConfigError(f"data.tokenizer.{key} is required: data.tokenizer.type={kind} builds GPT-2's "
                              f"byte-level BPE from data.tokenizer.{' and data.tokenizer.'.join(FILE_TOKENIZERS[kind])}")
        path = Path(str(value)).expanduser()
        if not path.is_file():
            raise ConfigError(f"data.tokenizer.{key}: {value} does not exist (data.tokenizer.type={kind} reads the "
                              "model's vocabulary from it: GPT-2's vocab.json / merges.txt)")
        paths.append(path)
    return GPT2BPETokenizer(*paths)


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece model (Llama/Mistral ``tokenizer.model``); needs the ``sentencepiece`` package."""

    def __init__(self, path: str | Path) -> None:
        try:
            import sentencepiece
        except ImportError as exc:
            raise ConfigError(
                f"{path} looks like a SentencePiece model; loading it needs: pip install 'nxd-data[sentencepiece]'"
            ) from exc
        self.path = str(path)
        try:
            self._sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
        except Exception as exc:  # noqa: BLE001 - report the library's reason with the path
            raise ConfigError(f"{path} is neither a tokenizer.json nor a SentencePiece model: {exc}") from exc
        self.vocab_size = self._sp.vocab_size()
        self.eos_id, self.bos_id, self.pad_id = (
            (i if i >= 0 else None) for i in (self._sp.eos_id(), self._sp.bos_id(), self._sp.pad_id())
        )
        config = _read_json(Path(path).parent / "tokenizer_config.json") or {}
        template = config.get("chat_template")
        self.chat_template = template if isinstance(template, str) else None

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._sp.encode(list(texts))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        ids = [int(i) for i in ids]
        if not skip_special_tokens:
            # SentencePiece drops control tokens when decoding; keep them visible like HF does
            out, run = [], []
            for i in ids:
                if self._sp.is_control(i):
                    if run:
                        out.append(self._sp.decode(run))
                        run = []
                    out.append(self._sp.id_to_piece(i))
                else:
                    run.append(i)
            if run:
                out.append(self._sp.decode(run))
            return "".join(out)
        return self._sp.decode(ids)

    def token_to_id(self, token: str) -> int | None:
        i = self._sp.piece_to_id(token)
        return None if i == self._sp.unk_id() and token != self._sp.id_to_piece(i) else i


def _read_json(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: invalid JSON ({exc})") from exc
    return data if isinstance(data, dict) else None


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load the tokenizer at ``path``: a ``tokenizer.json``, a SentencePiece model file, or a
    directory holding either (``tokenizer.json`` preferred), or NxD Training's ``data.tokenizer``
    section (``type``/``model`` a path, or a type of :data:`FILE_TOKENIZERS` with its files).
    Never touches the network."""
    if isinstance(path, dict) and path.get("type") in FILE_TOKENIZERS:
        return _from_files(path)
    if isinstance(path, dict):  # NxDT YAML: tokenizer: {type: <path>} or {model: <path>}
        path = path.get("type") or path.get("model") or path.get("path") or ""
    p = Path(str(path)).expanduser()
    if p.is_dir():
        for name in ("tokenizer.json", "tokenizer.model"):
            if (p / name).is_file():
                p = p / name
                break
        else:
            raise ConfigError(f"tokenizer directory {p} holds neither tokenizer.json nor tokenizer.model")
    if not p.is_file():
        raise ConfigError(f"tokenizer path {p} does not exist (expected tokenizer.json, a .model file, or a directory)")
    with open(p, "rb") as fh:
        head = fh.read(1)
    if p.suffix == ".json" or head == b"{":
        return HFTokenizer(p)
    return SentencePieceTokenizer(p)
