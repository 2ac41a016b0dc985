"""Checkpoints written by NxD's own converter load at any TP/PP, and nxd's load back into NxD's.

NxD's ``scripts/checkpoint_converter.py`` (vendored unchanged as
``neuronx_distributed.scripts.checkpoint_converter``, torch-xla's serialization aside) converts a
Hugging Face Llama (GQA) to NxD's layout in each naming NxD's modules use: fused
``qkv_proj.weight_qkv``, separate ``qkv_proj.weight_q/k/v`` (``GQAQKVColumnParallelLinear(
fuse_qkv=False)``), plain ``q_proj/k_proj/v_proj``, KV heads replicated (``kv_size_multiplier``,
one piece or two tiled pieces), torch-xla's xser files, at TP=1/2/4 and PP=1/2. Each loads into
nxd's Llama at TP=1 and TP=2 with ``load_checkpoint`` (the converter writes no ``done``: the tag is
named) and its logits equal transformers' (the oracle). Reverse: a checkpoint nxd saved is merged
by NxD's ``--convert_to_full_state`` into the Hugging Face state dict it came from, tensor for tensor.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from nxd.transforms import parallelize_model

pytest.importorskip("transformers")
pytest.importorskip("nxd_models_llama")

BASE = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=64, rms_norm_eps=1e-5, initializer_range=0.1, bos_token_id=None,
            eos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
#: name -> (query heads, KV heads, TP written at, converter flags): every layout NxD's converter
#: writes for Llama (--hw_backend trn2 unless named; its trn1 GQA path needs TP >= KV heads). kv_pieces_*: 2 KV heads replicated twice over TP=4, two distinct pieces, tiled
#: by the converter; trn1 permutes the query heads to match (the HF model), trn2 leaves them in order
LAYOUTS = {
    "fused_qkv": (4, 2, 2, ["--qkv_linear", "1", "--fuse_qkv", "1"]),
    "separate_qkv": (4, 2, 2, ["--qkv_linear", "1"]),
    "plain_q_k_v_proj": (4, 2, 2, []),
    "kv_replicas": (4, 1, 2, ["--qkv_linear", "1", "--fuse_qkv", "1", "--kv_size_multiplier", "2"]),
    "xser": (4, 2, 2, ["--qkv_linear", "1", "--fuse_qkv", "1", "--save_xser", "1"]),
    "tp1": (4, 2, 1, ["--qkv_linear", "1", "--fuse_qkv", "1"]),
    "pp2_tp2": (4, 2, 2, ["--qkv_linear", "1", "--pp_size", "2"]),
    "kv_pieces_trn1": (8, 2, 4, ["--qkv_linear", "1", "--fuse_qkv", "1", "--kv_size_multiplier", "2",
                                 "--hw_backend", "trn1"]),
}
TRN2_PIECES = (8, 2, 4, ["--qkv_linear", "1", "--fuse_qkv", "1", "--kv_size_multiplier", "2", "--hw_backend", "trn2"])
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


def _convert(root: Path, name: str, heads: int, kv_heads: int, tp: int, flags: list[str]):
    """The HF model and the config NxD's converter wrote ``root/name`` from, at ``tp``."""
    hf = _hf_model(kv_heads, heads)
    full, config = _write_hf(hf, root / "hf" / name)
    _nxd_converter("--convert_from_full_state", "--tp_size", str(tp), "--hw_backend", "trn2", "--input_dir", str(full),
                   "--config", str(config), "--output_dir", str(root / "ckpts" / name), *flags)
    assert not (root / "ckpts" / name / "done").exists()  # NxD's converter leaves no marker
    return hf, config


def load_logits_body(root: str, cases: dict[str, str], tp: int) -> dict | None:
    """``tag -> (logits, tiled-layout warnings)`` of nxd's Llama loaded from each tag at ``tp``
    (TP=1: in this process, without torch.distributed)."""
    import warnings

    import nxd
    from nxd_core_parallel import parallel_state
    from nxd_models_llama import LlamaForCausalLM, gather_vocab_logits

    if tp > 1:
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    out = {}
    for tag, config in cases.items():
        torch.manual_seed(123)  # not the HF seed: every weight must come from the checkpoint
        model = parallelize_model(LlamaForCausalLM(json.loads(Path(config).read_text())))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            nxd.load_checkpoint(root, tag=tag, model=model)
        with torch.no_grad():
            logits = model(IDS).logits
            out[tag] = (gather_vocab_logits(logits, model.config.vocab_size) if tp > 1 else logits,
                        [str(w.message) for w in caught if "tiled over TP" in str(w.message)])
    return out if tp == 1 or torch.distributed.get_rank() == 0 else None


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).abs().max() / want.abs().max()).item()


def test_nxd_converter_layouts_load_at_any_tp_with_hf_logits(rank_pool, tmp_path):
    # every layout, written at TP=1/2/4 (PP=1/2), loads at TP=2 and at TP=1: NxD's files carry no
    # sharding, the model does; K/V tiled by NxD are renumbered into nxd's adjacent layout
    cases, want = {}, {}
    for name, (heads, kv_heads, tp, flags) in LAYOUTS.items():
        hf, config = _convert(tmp_path, name, heads, kv_heads, tp, flags)
        cases[name] = str(config)
        with torch.no_grad():
            want[name] = hf(IDS).logits.double()
    root = str(tmp_path / "ckpts")
    for tp in (1, 2):
        got = load_logits_body(root, cases, 1) if tp == 1 else rank_pool(2).run(load_logits_body, root, cases, 2)[0]
        for name, (logits, tiled_warnings) in got.items():
            # fp32 model vs fp32 model: the same ops in another order (TP reductions), errors ~1e-6
            assert _rel_err(logits, want[name]) < 1e-5, (tp, name, _rel_err(logits, want[name]))
            assert bool(tiled_warnings) == (name == "kv_pieces_trn1"), (tp, name, tiled_warnings)


def test_nxd_converter_trn2_kv_pieces_load_as_nxd_computes_them_and_say_so(tmp_path):
    # NxD's converter --hw_backend trn2 tiles K/V but leaves the query heads in order: NxD's own
    # attention then pairs query heads 2-3 with KV head 1 (not the HF model). nxd reads it as NxD's
    # attention computes it and warns naming the converter option that writes the consistent layout
    heads, kv_heads, tp, flags = TRN2_PIECES
    hf, config = _convert(tmp_path, "trn2", heads, kv_heads, tp, flags)
    logits, messages = load_logits_body(str(tmp_path / "ckpts"), {"trn2": str(config)}, 1)["trn2"]
    with torch.no_grad():
        assert _rel_err(logits, hf(IDS).logits.double()) > 0.1
        # what NxD's attention computes with that file: TP rank r's query heads 2r, 2r+1 with KV
        # head r % 2, i.e. the HF model with query heads (and o_proj columns) in order 0 1 4 5 2 3 6 7
        rows = torch.tensor([0, 1, 4, 5, 2, 3, 6, 7]).repeat_interleave(4) * 4 + torch.arange(4).repeat(8)
        for layer in hf.model.layers:
            layer.self_attn.q_proj.weight.copy_(layer.self_attn.q_proj.weight[rows])
            layer.self_attn.o_proj.weight.copy_(layer.self_attn.o_proj.weight[:, rows])
        assert _rel_err(logits, hf(IDS).logits.double()) < 1e-5
    assert any("--hw_backend trn1" in m for m in messages), messages


def save_nxd_body(root: str, hf_dirs: dict[str, str]) -> None:
    import nxd
    from nxd_core_parallel import parallel_state
    from nxd_models_llama import LlamaForCausalLM, load_hf_checkpoint

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    for tag, hf_dir in hf_dirs.items():
        model = parallelize_model(LlamaForCausalLM(json.loads((Path(hf_dir) / "config.json").read_text())))
        load_hf_checkpoint(model, hf_dir)
        nxd.save_checkpoint(root, tag, model=model)


#: tag -> (query heads, KV heads, NxD converter flags beyond --qkv_linear 1 --fuse_qkv 1)
SAVED = {
    # 2 query heads over 1 KV head replicated on both ranks: NxD's converter splits a fused local
    # [q | k | v] in three equal parts, which is this model's local layout (1 head each)
    "kv_replicas": (2, 1, ["--kv_size_multiplier", "2"]),
    # multi-head attention, fused: NxD's converter splits it by hidden_size / tp (its non-GQA path).
    # Not here: GQA with fewer local KV than query heads (NxD's converter splits any fused
    # weight_qkv in three equal parts, so it cannot merge NxD's own such files either)
    "mha": (4, 4, []),
}


def test_nxd_checkpoint_converts_back_with_nxd_converter(rank_pool, tmp_path):
    hfs = {tag: _hf_model(kv_heads=kv, heads=heads) for tag, (heads, kv, _) in SAVED.items()}
    for tag, hf in hfs.items():
        hf.save_pretrained(tmp_path / "hf" / tag)
    rank_pool(2).run(save_nxd_body, str(tmp_path / "ckpts"), {tag: str(tmp_path / "hf" / tag) for tag in SAVED})
    for tag, (_, _, flags) in SAVED.items():
        _nxd_converter("--convert_to_full_state", "--tp_size", "2", "--hw_backend", "trn2", "--qkv_linear", "1",
                       "--fuse_qkv", "1", *flags, "--config", str(tmp_path / "hf" / tag / "config.json"),
                       "--input_dir", str(tmp_path / "ckpts" / tag / "model"), "--output_dir", str(tmp_path / "full" / tag))
        merged = torch.load(tmp_path / "full" / tag / "checkpoint.pt", weights_only=True)
        original = hfs[tag].state_dict()
        assert sorted(merged) == sorted(original), tag
        assert [k for k in original if not torch.equal(merged[k], original[k])] == [], tag


def _nxd_module_attention(heads: int, kv_heads: int, kv_mult: int) -> torch.nn.Module:
    """Llama's attention names over NxD's modules (``neuronx_distributed``): separate
    ``qkv_proj.weight_q/k/v`` (``fuse_qkv=False``), as NxD's example models build with
    ``--fuse_qkv 0``; the same seed gives the same full weights at every TP size."""
    from neuronx_distributed.modules.qkv_linear import GQAQKVColumnParallelLinear
    from neuronx_distributed.parallel_layers import ColumnParallelLinear, ParallelEmbedding, RowParallelLinear

    torch.manual_seed(7)
    hidden, head_dim = 32, 32 // heads
    attn = torch.nn.Module()
    attn.qkv_proj = GQAQKVColumnParallelLinear(hidden, [heads * head_dim, kv_heads * head_dim], bias=False,
                                               kv_size_multiplier=kv_mult, fuse_qkv=False)
    attn.o_proj = RowParallelLinear(hidden, hidden, bias=False, input_is_parallel=True)
    layer = torch.nn.Module()
    layer.self_attn = attn
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.embed_tokens = ParallelEmbedding(64, hidden)
    model.model.layers = torch.nn.ModuleList([layer])
    model.lm_head = ColumnParallelLinear(hidden, 64, bias=False, gather_output=False)
    return model


#: tag -> (query heads, KV heads, kv_size_multiplier at TP=2)
UNFUSED = {"unfused_gqa": (4, 2, 1), "unfused_kv_replicas": (4, 1, 2)}


def save_unfused_body(root: str) -> None:
    import nxd
    from neuronx_distributed.parallel_layers import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    for tag, (heads, kv_heads, mult) in UNFUSED.items():
        nxd.save_checkpoint(root, tag, model=_nxd_module_attention(heads, kv_heads, mult))


def test_nxd_module_checkpoint_with_separate_qkv_converts_back(rank_pool, tmp_path):
    # nxd saves NxD's modules as they are named; NxD's converter (--qkv_linear 1, no --fuse_qkv)
    # merges the TP=2 files into the full tensors the same modules hold at TP=1
    rank_pool(2).run(save_unfused_body, str(tmp_path / "ckpts"))
    for tag, (heads, kv_heads, mult) in UNFUSED.items():
        config = tmp_path / f"{tag}.json"
        config.write_text(json.dumps(dict(BASE, num_hidden_layers=1, num_attention_heads=heads,
                                          num_key_value_heads=kv_heads)))
        _nxd_converter("--convert_to_full_state", "--tp_size", "2", "--hw_backend", "trn2", "--qkv_linear", "1",
                       "--kv_size_multiplier", str(mult), "--config", str(config), "--input_dir",
                       str(tmp_path / "ckpts" / tag / "model"), "--output_dir", str(tmp_path / "full" / tag))
        merged = torch.load(tmp_path / "full" / tag / "checkpoint.pt", weights_only=True)
        full = _nxd_module_attention(heads, kv_heads, 1).state_dict()  # TP=1 in this process: the full tensors
        want = {k.replace("qkv_proj.weight_", "").replace("self_attn.q", "self_attn.q_proj.weight")
                .replace("self_attn.k", "self_attn.k_proj.weight").replace("self_attn.v", "self_attn.v_proj.weight"): v
                for k, v in full.items()}
        assert sorted(merged) == sorted(want), (tag, sorted(merged))
        assert [k for k in want if not torch.equal(merged[k], want[k])] == [], tag
