"""Megatron-LM / NeMo checkpoints: a small writer (this file) lays out a reference model's weights
the way Megatron saves them, TP- and PP-sharded, and the loader must rebuild the same model at TP=1
and TP=2 (equal logits). Also: weights-only loading refuses a file that pickles arbitrary objects.

The writer follows Megatron's documented layout independently of the loader: ``mp_rank_{tp:02d}
[_{pp:03d}]/model_optim_rng.pt`` holding ``args`` (argparse.Namespace), ``checkpoint_version``,
``iteration``, ``model`` and ``rng_state`` (with numpy's RNG state, as Megatron writes it);
column-parallel weights split by rows (swiglu's fc1 shard is ``[gate_r; up_r]``), row-parallel by
columns, vocabulary padded to ``make_vocab_size_divisible_by * tp`` (padding rows filled with junk
that must not matter), layer numbers local to each pipeline stage.
"""

from __future__ import annotations

import argparse
import io
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from nxd.transforms import parallelize_model

sys.path.insert(0, str(Path(__file__).parent))

VOCAB = 100
#: legacy Megatron-LM layout (GPT-2-like): tied, biases, learned positions; TP=2 x PP=2
LEGACY = dict(vocab_size=VOCAB, make_vocab_size_divisible_by=16, hidden_size=32, ffn_hidden_size=64, num_layers=4,
              num_attention_heads=4, max_position_embeddings=32, hidden_dropout=0.0, attention_dropout=0.0,
              init_method_std=0.1)
#: Megatron-core / NeMo layout with Transformer Engine names: swiglu, RMSNorm, partial RoPE, GQA, untied, no bias
MCORE = dict(LEGACY, activation="swiglu", normalization="RMSNorm", position_embedding_type="rope",
             rotary_percentage=0.5, num_query_groups=2, share_embeddings_and_output_weights=False, has_bias=False,
             num_layers=2)

_LEGACY_NAMES = (("self_attention.linear_qkv.", "self_attention.query_key_value."),
                 ("self_attention.linear_proj.", "self_attention.dense."),
                 ("pre_mlp_layernorm.", "post_attention_layernorm."),
                 ("mlp.linear_fc1.", "mlp.dense_h_to_4h."), ("mlp.linear_fc2.", "mlp.dense_4h_to_h."))


class NotAllowed:
    """A class a checkpoint must not be able to instantiate."""


def _reference(config: dict):
    from nxd_models_gpt import GPTConfig, GPTForCausalLM

    torch.manual_seed(0)
    model = parallelize_model(GPTForCausalLM(GPTConfig.from_dict(config)))
    with torch.no_grad():  # non-trivial norms and biases
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def _tp_split(name: str, t: torch.Tensor, tp: int, gated: bool) -> list[torch.Tensor]:
    if name.endswith(("word_embeddings.weight", "output_layer.weight", "linear_qkv.weight", "linear_qkv.bias")):
        return list(t.chunk(tp, 0))
    if ".linear_fc1." in name:
        if not gated:
            return list(t.chunk(tp, 0))
        gate, up = t.chunk(2, 0)
        return [torch.cat([g, u]) for g, u in zip(gate.chunk(tp, 0), up.chunk(tp, 0))]
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return list(t.chunk(tp, 1))
    return [t] * tp


def write_megatron(model, out: Path, tp: int, pp: int, style: str) -> None:
    """``style`` "legacy": Megatron-LM's language_model/encoder dicts in model_optim_rng.pt;
    "nemo_te": NeMo's flat ``model.``-prefixed Megatron-core keys with Transformer Engine fused norms
    in model_weights.ckpt (with ``_extra_state`` blobs)."""
    cfg = model.config
    gated = cfg.activation == "swiglu"
    padded = -(-cfg.vocab_size // (cfg.make_vocab_size_divisible_by * tp)) * cfg.make_vocab_size_divisible_by * tp
    full = {k: v.detach().clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(7)
    for key in ("embedding.word_embeddings.weight", "output_layer.weight"):
        real = full[key][: cfg.vocab_size]
        full[key] = torch.cat([real, torch.randn(padded - cfg.vocab_size, real.shape[1], generator=g)])
    per_stage = cfg.num_layers // pp
    args = argparse.Namespace(num_layers=cfg.num_layers, hidden_size=cfg.hidden_size,
                              ffn_hidden_size=cfg.ffn_hidden_size, num_attention_heads=cfg.num_attention_heads,
                              tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                              padded_vocab_size=padded, swiglu=gated, params_dtype=torch.float32)
    for pp_rank in range(pp):
        first, last = pp_rank == 0, pp_rank == pp - 1
        for tp_rank in range(tp):
            flat = {}
            for name, tensor in full.items():
                if name.startswith("embedding.") and not first:
                    continue
                if name.startswith(("decoder.final_layernorm.", "output_layer.")) and not last:
                    continue
                if name == "output_layer.weight" and cfg.share_embeddings_and_output_weights:
                    continue
                if name.startswith("decoder.layers."):
                    index = int(name.split(".")[2])
                    if index // per_stage != pp_rank:
                        continue
                    name = name.replace(f"layers.{index}.", f"layers.{index % per_stage}.", 1)
                flat[name] = _tp_split(name, tensor, tp, gated)[tp_rank].clone()
            if style == "legacy":
                state = {"args": args, "checkpoint_version": 3.0, "iteration": 10, "model": _legacy(flat),
                         "rng_state": [{"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
                                        "torch_rng_state": torch.get_rng_state()}]}
                name = "model_optim_rng.pt"
            else:
                state = _nemo_te(flat)
                name = "model_weights.ckpt"
            d = out / (f"mp_rank_{tp_rank:02d}" + (f"_{pp_rank:03d}" if pp > 1 else ""))
            d.mkdir(parents=True)
            torch.save(state, d / name)


def _legacy(flat: dict) -> dict:
    lm: dict = {}
    for name, t in flat.items():
        if name.startswith("embedding."):
            part = name.split(".")[1]
            lm.setdefault("embedding", {}).setdefault(part, {})["weight"] = t
        elif name.startswith("output_layer."):
            lm.setdefault("output_layer", {})["weight"] = t
        else:
            key = name.replace("decoder.", "", 1)
            for new, old in _LEGACY_NAMES:
                key = key.replace(new, old)
            lm.setdefault("encoder", {})[key] = t
    return {"language_model": lm}


def _nemo_te(flat: dict) -> dict:
    te = {"input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
          "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight"}
    out = {}
    for name, t in flat.items():
        for ours, theirs in te.items():
            name = name.replace(ours, theirs)
        out["model." + name] = t
        if name.endswith("linear_qkv.weight"):
            out["model." + name.replace("weight", "_extra_state")] = io.BytesIO(b"te-fp8-meta")
    return out


def _logits(model, ids):
    from nxd_models_gpt import gather_vocab_logits

    return gather_vocab_logits(model, model(ids).logits).detach()


def load_body(config: dict, ckpt: str, ids: torch.Tensor) -> torch.Tensor:
    from nxd_core_parallel import parallel_state
    from nxd_models_gpt import GPTConfig, GPTForCausalLM, load_megatron_checkpoint

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    torch.manual_seed(123)  # a different init: every weight must come from the checkpoint
    model = parallelize_model(GPTForCausalLM(GPTConfig.from_dict(config)))
    load_megatron_checkpoint(model, ckpt)
    out = _logits(model, ids)
    parallel_state.destroy_model_parallel()
    return out


@pytest.mark.parametrize("config,tp,pp,style", [(LEGACY, 2, 2, "legacy"), (MCORE, 2, 1, "nemo_te")],
                         ids=["legacy-tp2-pp2", "nemo-te-tp2"])
def test_megatron_checkpoint_loads_at_tp1_and_tp2(config, tp, pp, style, tmp_path, rank_pool):
    from nxd_models_gpt import GPTConfig, GPTForCausalLM, load_megatron_checkpoint

    reference = _reference(config)
    root = tmp_path / "ckpt"
    if style == "legacy":  # Megatron's save directory: the loader must follow the tracker file
        write_megatron(reference, root / "iter_0000010", tp, pp, style)
        (root / "latest_checkpointed_iteration.txt").write_text("10")
    else:
        write_megatron(reference, root, tp, pp, style)
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(3))
    expected = _logits(reference, ids)

    torch.manual_seed(123)
    model = parallelize_model(GPTForCausalLM(GPTConfig.from_dict(config)))
    args = load_megatron_checkpoint(model, root)
    assert style != "legacy" or args.padded_vocab_size == 128
    assert torch.equal(_logits(model, ids), expected)  # TP=1: the same computation

    got = rank_pool(2).run(load_body, config, str(root), ids)
    err = (got[0] - expected).abs().max().item()
    print(f"\n{style}: TP=2 logits max abs error {err:.3g}, rel {err / expected.abs().max().item():.3g}")
    assert torch.allclose(got[0], expected, rtol=0, atol=1e-5 * expected.abs().max().item())
    assert torch.equal(got[0], got[1])


def test_pickled_code_is_refused(tmp_path):
    from nxd_models_gpt import GPTConfig, GPTForCausalLM, load_megatron_checkpoint
    from nxd_models_gpt.safe_load import UnsafeCheckpointError

    d = tmp_path / "ckpt" / "mp_rank_00"
    d.mkdir(parents=True)
    torch.save({"model": {}, "callback": NotAllowed()}, d / "model_optim_rng.pt")
    model = parallelize_model(GPTForCausalLM(GPTConfig.from_dict(dict(LEGACY, num_layers=1))))
    with pytest.raises(UnsafeCheckpointError, match="refused to unpickle .*NotAllowed.*weights-only"):
        load_megatron_checkpoint(model, tmp_path / "ckpt")


def test_bad_layouts_are_named(tmp_path):
    from nxd_models_gpt import GPTConfig, GPTForCausalLM, load_megatron_checkpoint
    from nxd_models_gpt.megatron_ckpt import MegatronCheckpointError

    model = parallelize_model(GPTForCausalLM(GPTConfig.from_dict(dict(LEGACY, num_layers=1))))
    (tmp_path / "empty").mkdir()
    with pytest.raises(MegatronCheckpointError, match="no mp_rank_XX"):
        load_megatron_checkpoint(model, tmp_path / "empty")
    write_megatron(_reference(LEGACY), tmp_path / "four", 1, 1, "legacy")
    with pytest.raises(MegatronCheckpointError, match="num_layers"):
        load_megatron_checkpoint(model, tmp_path / "four")


def _flat_model(file: Path) -> dict[str, torch.Tensor]:
    from nxd_models_gpt.safe_load import load_weights_only

    def walk(tree, prefix=""):
        for k, v in tree.items():
            yield from walk(v, f"{prefix}{k}.") if isinstance(v, dict) else [(prefix + k, v)]

    return dict(walk(load_weights_only(file)["model"]))


def test_export_roundtrip_and_nxd_ckpt_convert(tmp_path):
    """load -> save_megatron_checkpoint at the source's TP=2 x PP=2 gives the writer's files back
    (vocabulary padding aside); ``nxd ckpt convert`` megatron -> hf loads in transformers with the
    reference logits, and hf -> megatron loads back to the same logits."""
    from gpt_test_utils import quiet_transformers
    from transformers import GPT2LMHeadModel

    from nxd_ckpt.convert import ConvertRequest, convert
    from nxd_models_gpt import GPTConfig, GPTForCausalLM, load_megatron_checkpoint, save_megatron_checkpoint

    quiet_transformers()
    reference = _reference(LEGACY)
    src = tmp_path / "src"
    write_megatron(reference, src, 2, 2, "legacy")
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(3))
    expected = _logits(reference, ids)

    model = parallelize_model(GPTForCausalLM(GPTConfig.from_dict(LEGACY)))
    load_megatron_checkpoint(model, src)
    save_megatron_checkpoint(model.state_dict(), model.config, tmp_path / "out", tp=2, pp=2, iteration=10)
    for rank_dir in sorted(p.name for p in src.iterdir()):
        ours = _flat_model(tmp_path / "out" / "iter_0000010" / rank_dir / "model_optim_rng.pt")
        theirs = _flat_model(src / rank_dir / "model_optim_rng.pt")
        assert set(ours) == set(theirs), rank_dir
        for key, t in theirs.items():
            if "word_embeddings" in key:  # rows past the real vocabulary are padding (junk in the source)
                start = int(rank_dir[len("mp_rank_"):][:2]) * t.shape[0]
                keep = max(0, min(t.shape[0], VOCAB - start))
                assert torch.equal(ours[key][:keep], t[:keep]) and not ours[key][keep:].any(), key
            else:
                assert torch.equal(ours[key], t), (rank_dir, key)

    hf_dir = tmp_path / "hf"
    convert("megatron", "hf", ConvertRequest(str(src), str(hf_dir), model="gpt", config=LEGACY))
    hf_logits = GPT2LMHeadModel.from_pretrained(str(hf_dir))(ids).logits.detach()
    assert (hf_logits - expected).abs().max().item() <= 1e-5 * expected.abs().max().item()
    back = tmp_path / "back"
    convert("hf", "megatron", ConvertRequest(str(hf_dir), str(back), model="gpt"))
    again = parallelize_model(GPTForCausalLM(GPTConfig.from_dict(LEGACY)))
    load_megatron_checkpoint(again, back)
    assert torch.equal(_logits(again, ids), expected)
