"""TP=4 on four gloo ranks, where KV heads are fewer than ranks (replicated KV heads)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from llama_test_utils import (  # noqa: E402
    CONFIGS,
    assert_exported_logits_equal,
    assert_same_tensors,
    batch,
    compare,
    hf_generate,
    hf_reference,
    parity_body,
    quiet_transformers,
    roundtrip_body,
    save_hf,
)

quiet_transformers()


@pytest.mark.slow
def test_tp4_kv_replication_parity_and_roundtrip(rank_pool, tmp_path):
    # gqa: 2 KV heads replicated 2x; mqa: 1 KV head replicated 4x; llama3_rope with sequence parallel.
    cases = [("gqa", False), ("mqa", False), ("llama3_rope", True)]
    dirs = {name: save_hf(name, tmp_path / name) for name, _ in cases}
    data = {name: batch(CONFIGS[name]["vocab_size"]) for name, _ in cases}
    pool = rank_pool(4)
    results = pool.run(parity_body, 4, [(n, str(dirs[n]), sp) for n, sp in cases], data)[0]
    worst = {f"{n}{'+sp' if sp else ''}": compare(results[(n, sp)], hf_reference(dirs[n], data[n])) for n, sp in cases}
    print(f"\nTP=4 worst relative error per config: {worst}")

    out = tmp_path / "mqa-out"
    prompt = data["mqa"]["input_ids"][:, :5]
    tokens = pool.run(roundtrip_body, 4, str(dirs["mqa"]), str(out), prompt, 20)
    assert_same_tensors(dirs["mqa"], out)
    assert_exported_logits_equal(out, dirs["mqa"], data["mqa"])
    assert all(t.equal(hf_generate(dirs["mqa"], prompt, 20)) for t in tokens)
