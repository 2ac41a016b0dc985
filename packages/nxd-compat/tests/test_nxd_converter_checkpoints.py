"""Checkpoints written by NxD's own converter load as written, and nxd's load back into NxD's.

NxD's ``scripts/checkpoint_converter.py`` (vendored unchanged as
``neuronx_distributed.scripts.checkpoint_converter``, torch-xla's serialization aside) converts a
Hugging Face Llama (GQA) to NxD's TP=2 layout in each naming NxD's modules use: fused
``qkv_proj.weight_qkv``, separate ``qkv_proj.weight_q/k/v`` (``GQAQKVColumnParallelLinear(
fuse_qkv=False)``), plain ``q_proj/k_proj/v_proj``, KV heads replicated (``kv_size_multiplier``),
and torch-xla's xser files. Each loads into nxd's Llama at TP=2 with ``load_checkpoint`` (the
converter writes no ``done``: the tag is named) and its logits equal transformers' (the oracle).
Reverse: a checkpoint nxd saved is merged by NxD's ``--convert_to_full_state`` into the Hugging
Face state dict it came from, tensor for tensor.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("nxd_models_llama")

BASE = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=64, rms_norm_eps=1e-5, initializer_range=0.1, bos_token_id=None,
            eos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
COMMON = ["--convert_from_full_state", "--tp_size", "2", "--hw_backend", "trn2"]
#: name -> (num_key_value_heads, converter flags): every layout NxD's converter writes for Llama
LAYOUTS = {
    "fused_qkv": (2, ["--qkv_linear", "1", "--fuse_qkv", "1"]),
    "separate_qkv": (2, ["--qkv_linear", "1"]),
    "plain_q_k_v_proj": (2, []),
    "kv_replicas": (1, ["--qkv_linear", "1", "--fuse_qkv", "1", "--kv_size_multiplier", "2"]),
    "xser": (2, ["--qkv_linear", "1", "--fuse_qkv", "1", "--save_xser", "1"]),
}
IDS = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(3))


def _hf_model(kv_heads: int, heads: int = 4):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**dict(BASE, num_attention_heads=heads, num_key_value_heads=kv_heads))).float()


def _nxd_converter(*argv: str) -> None:
    """NxD's converter run as its examples' ``convert_checkpoints.py`` runs it."""
    from neuronx_distributed.scripts.checkpoint_converter import CheckpointConverterBase

    converter = CheckpointConverterBase()
    args, _ = converter.get_arg_parser().parse_known_args(list(argv))
    converter.run(args)


def _write_hf(model, where: Path) -> tuple[Path, Path]:
    where.mkdir(parents=True)
    torch.save(model.state_dict(), where / "full.pt")
    (where / "config.json").write_text(json.dumps(model.config.to_dict()))
    return where / "full.pt", where / "config.json"


def load_logits_body(root: str, cases: dict[str, str]) -> dict | None:
    import nxd
    from nxd_core_parallel import parallel_state
    from nxd_models_llama import LlamaForCausalLM, gather_vocab_logits

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    out = {}
    for tag, config in cases.items():
        torch.manual_seed(123)  # not the HF seed: every weight must come from the checkpoint
        model = LlamaForCausalLM(json.loads(Path(config).read_text()))
        nxd.load_checkpoint(root, tag=tag, model=model)
        with torch.no_grad():
            out[tag] = gather_vocab_logits(model(IDS).logits, model.config.vocab_size)
    return out if torch.distributed.get_rank() == 0 else None


def test_nxd_converter_layouts_load_with_hf_logits(rank_pool, tmp_path):
    root = tmp_path / "ckpts"
    cases, want = {}, {}
    for name, (kv_heads, flags) in LAYOUTS.items():
        hf = _hf_model(kv_heads)
        full, config = _write_hf(hf, tmp_path / "hf" / name)
        _nxd_converter(*COMMON, "--input_dir", str(full), "--config", str(config), "--output_dir",
                       str(root / name), *flags)
        assert not (root / name / "done").exists()  # NxD's converter leaves no marker
        cases[name] = str(config)
        with torch.no_grad():
            want[name] = hf(IDS).logits.double()
    got = rank_pool(2).run(load_logits_body, str(root), cases)[0]
    for name in LAYOUTS:
        # fp32 model vs fp32 model: the same ops in another order (TP reductions), errors ~1e-6
        err = ((got[name].double() - want[name]).abs().max() / want[name].abs().max()).item()
        assert err < 1e-5, (name, err)


def save_nxd_body(root: str, hf_dir: str) -> None:
    import nxd
    from nxd_core_parallel import parallel_state
    from nxd_models_llama import LlamaForCausalLM, load_hf_checkpoint

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    model = LlamaForCausalLM(json.loads((Path(hf_dir) / "config.json").read_text()))
    load_hf_checkpoint(model, hf_dir)
    nxd.save_checkpoint(root, "from_nxd", model=model)


def test_nxd_checkpoint_converts_back_with_nxd_converter(rank_pool, tmp_path):
    # 2 query heads over 1 KV head replicated on both ranks: NxD's converter splits a fused local
    # [q | k | v] in three equal parts, which is this model's local layout (1 head each)
    hf = _hf_model(kv_heads=1, heads=2)
    hf.save_pretrained(tmp_path / "hf")
    rank_pool(2).run(save_nxd_body, str(tmp_path / "ckpts"), str(tmp_path / "hf"))
    _nxd_converter("--convert_to_full_state", "--tp_size", "2", "--hw_backend", "trn2", "--qkv_linear", "1",
                   "--fuse_qkv", "1", "--kv_size_multiplier", "2", "--config", str(tmp_path / "hf" / "config.json"),
                   "--input_dir", str(tmp_path / "ckpts" / "from_nxd" / "model"), "--output_dir", str(tmp_path / "full"))
    merged = torch.load(tmp_path / "full" / "checkpoint.pt", weights_only=True)
    original = hf.state_dict()
    assert sorted(merged) == sorted(original)
    assert [k for k in original if not torch.equal(merged[k], original[k])] == []


def other_tp_body(root: str, config: str) -> str:
    import nxd
    from nxd_ckpt import CheckpointError
    from nxd_core_parallel import parallel_state
    from nxd_models_llama import LlamaForCausalLM

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    model = LlamaForCausalLM(json.loads(Path(config).read_text()))
    try:
        nxd.load_checkpoint(root, tag="fused", model=model)
    except CheckpointError as err:
        return str(err)
    return "loaded"


def test_nxd_checkpoint_at_another_tp_is_refused_by_name(rank_pool, tmp_path):
    # NxD's files carry no sharding description: loading its TP=2 layout at TP=1 must say so (not
    # fail on a shape, nor load one rank's half of every tensor)
    full, config = _write_hf(_hf_model(2), tmp_path / "hf")
    _nxd_converter(*COMMON, "--input_dir", str(full), "--config", str(config), "--output_dir",
                   str(tmp_path / "ckpts" / "fused"), *LAYOUTS["fused_qkv"][1])
    message = rank_pool(1).run(other_tp_body, str(tmp_path / "ckpts"), str(config))[0]
    assert "written by NxD at TP=2 PP=1" in message and "this run is TP=1" in message, message


def kv_pieces_body(root: str, config: str) -> list[str]:
    import warnings

    import nxd
    from nxd_core_parallel import parallel_state
    from nxd_models_llama import LlamaForCausalLM

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=4)
    model = LlamaForCausalLM(json.loads(Path(config).read_text()))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        nxd.load_checkpoint(root, tag="trn2", model=model)
    return [str(w.message) for w in caught]


@pytest.mark.slow
def test_nxd_replicated_kv_pieces_are_flagged(rank_pool, tmp_path):
    # 8 query / 2 KV heads at TP=4 with kv_size_multiplier 2: two distinct KV pieces, each on two ranks.
    # NxD's converter tiles them (trn2 output pairs query heads 2-3 with KV head 1: HF logits off by
    # ~100% as written); nxd cannot tell NxD's hardware layouts apart from the files, so it says so
    full, config = _write_hf(_hf_model(2, heads=8), tmp_path / "hf")
    args = [a if a != "2" else "4" for a in COMMON]
    _nxd_converter(*args, "--input_dir", str(full), "--config", str(config), "--output_dir", str(tmp_path / "ck" / "trn2"),
                   "--qkv_linear", "1", "--fuse_qkv", "1", "--kv_size_multiplier", "2")
    messages = rank_pool(4).run(kv_pieces_body, str(tmp_path / "ck"), str(config))[0]
    assert any("K/V heads replicated over TP" in m and "kv_size_multiplier [2] at TP=4" in m for m in messages), messages
