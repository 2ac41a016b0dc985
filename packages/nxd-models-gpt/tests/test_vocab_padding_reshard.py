"""Megatron's vocabulary padding depends on TP (a multiple of ``make_vocab_size_divisible_by x TP``:
with 64, 130 tokens are 192 rows at TP=1, 256 at TP=2), yet nxd checkpoints of GPT reshard across TP: the
embedding and output layer are saved at the real vocabulary size and re-padded with zero rows on load.
Oracle: the model built at the target TP and imported from the same Hugging Face weights (its
padding rows are zeros), every tensor equal, and transformers' logits."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from gpt_test_utils import batch, load_hf, quiet_transformers, save_hf, vocab  # noqa: E402

quiet_transformers()
NAME = "gpt2_padded_untied"  # 130 tokens, untied head


def _imported(hf_dir: str, tp: int, seed: int | None = None):
    """GPT at TP=``tp`` with ``hf_dir``'s weights (``seed``: random weights instead)."""
    from nxd.transforms import parallelize_model
    from nxd_core_parallel import parallel_state
    from nxd_models_gpt import GPTConfig, GPTForCausalLM, load_hf_checkpoint

    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    config = GPTConfig.from_dict(json.loads((Path(hf_dir) / "config.json").read_text()))
    config.make_vocab_size_divisible_by = 64  # 130 tokens: 192 rows at TP=1, 256 at TP=2
    torch.manual_seed(0 if seed is None else seed)
    model = parallelize_model(GPTForCausalLM(config))
    if seed is None:
        load_hf_checkpoint(model, hf_dir)
    return model


def reshard_body(hf_dir: str, root: str) -> dict:
    import nxd
    from nxd_core_parallel import parallel_state
    from nxd_models_gpt import gather_vocab_logits

    rows, differ, logits = {}, [], {}
    ids = batch(vocab(NAME))["input_ids"]
    for save_tp, load_tp in ((2, 1), (1, 2)):
        saved = _imported(hf_dir, save_tp)
        rows[save_tp] = saved.embedding.word_embeddings.weight.shape[0] * save_tp
        nxd.save_checkpoint(root, f"tp{save_tp}", model=saved)
        model = _imported(hf_dir, load_tp, seed=7)
        nxd.load_checkpoint(root, f"tp{save_tp}", model=model)
        want = _imported(hf_dir, load_tp).state_dict()
        differ += [f"tp{save_tp}->tp{load_tp}:{k}" for k, v in model.state_dict().items() if not torch.equal(v, want[k])]
        with torch.no_grad():
            logits[load_tp] = gather_vocab_logits(model, model(ids).logits)
    parallel_state.destroy_model_parallel()
    shapes = {k: v["shape"] for k, v in json.loads((Path(root) / "tp2" / "metadata.json").read_text())["tensors"].items()
              if k in ("embedding.word_embeddings.weight", "output_layer.weight")}
    return {"rows": rows, "differ": differ, "logits": logits, "shapes": shapes}


def test_gpt_vocab_padding_reshards_across_tp(rank_pool, tmp_path):
    hf_dir = save_hf(NAME, tmp_path / "hf")
    out = rank_pool(2).run(reshard_body, str(hf_dir), str(tmp_path / "ckpt"))
    want = load_hf(hf_dir)(batch(vocab(NAME))["input_ids"]).logits.detach()
    for r in out:
        assert r["rows"] == {1: 192, 2: 256}  # the padding differs with TP
        assert r["shapes"] == {"embedding.word_embeddings.weight": [130, 64], "output_layer.weight": [130, 64]}
        assert r["differ"] == []
        for tp, logits in r["logits"].items():
            rel = ((logits - want).abs().max() / want.abs().max()).item()
            assert rel < 1e-5, (tp, rel)
