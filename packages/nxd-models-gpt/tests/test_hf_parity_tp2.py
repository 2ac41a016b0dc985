"""TP=2 on two real gloo ranks (± sequence parallelism): import from transformers' GPT-2 / GPT-NeoX
checkpoints, parity of logits, loss and every gradient, export round trip and greedy generation."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from gpt_test_utils import (  # noqa: E402
    CONFIGS,
    assert_same_tensors,
    batch,
    compare,
    hf_generate,
    hf_reference,
    parity_body,
    pipeline_roundtrip_body,
    quiet_transformers,
    roundtrip_body,
    save_hf,
    vocab,
)

quiet_transformers()
SEQUENCE_PARALLEL = {"gpt2", "neox"}


@pytest.mark.slow
def test_tp2_parity_all_configs(rank_pool, tmp_path):
    dirs = {name: save_hf(name, tmp_path / name) for name in CONFIGS}
    data = {name: batch(vocab(name)) for name in CONFIGS}
    cases = [(name, str(d), sp) for name, d in dirs.items()
             for sp in ((False, True) if name in SEQUENCE_PARALLEL else (False,))]
    results = rank_pool(2).run(parity_body, 2, cases, data)[0]
    measured = {}
    for name, _, sp in cases:
        measured[f"{name}{'+sp' if sp else ''}"] = compare(results[(name, sp)], hf_reference(dirs[name], data[name]))
    print(f"\nTP=2 errors per config: {measured}")


def test_tp2_padded_vocab_roundtrip_and_generate(rank_pool, tmp_path):
    """130-token vocabulary padded to 256 at TP=2: export drops the padding (byte-equal to the
    source) and 20 greedy tokens equal transformers' generate."""
    src, out = save_hf("gpt2_padded_untied", tmp_path / "src"), tmp_path / "out"
    prompt = batch(vocab("gpt2_padded_untied"))["input_ids"][:, :4]
    tokens = rank_pool(2).run(roundtrip_body, 2, str(src), str(out), prompt, 20)
    assert_same_tensors(src, out)
    expected = hf_generate(src, prompt, 20)
    assert tokens[0].equal(expected) and tokens[1].equal(expected)


def test_pp2_import_export_roundtrip(rank_pool, tmp_path):
    """PP=2 on two ranks, tied GPT-2 (the last stage's head reads the embedding) and untied NeoX:
    the exported folder equals transformers' checkpoint byte for byte."""
    names = ["gpt2", "neox"]
    cases = [(str(save_hf(n, tmp_path / n)), str(tmp_path / f"{n}_pp2")) for n in names]
    rank_pool(2).run(pipeline_roundtrip_body, cases)
    for src, out in cases:
        assert_same_tensors(Path(src), Path(out))
