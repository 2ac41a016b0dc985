"""An NNM checkpoint (TP=2 x PP=2, ``tp_rank_XX_pp_rank_XXX/model_optim_rng.ckpt``, Megatron
names and grouped QKV) made here from known tensors converts with ``nxd ckpt convert --from nnm``
and loads into nxd's Llama at TP=2 with exactly the expected tensors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nxd.cli import main as nxd_main
from nxd.transforms import parallelize_model

H, HEADS, KV, FFN, VOCAB, LAYERS, TP, PP = 16, 4, 2, 24, 32, 4, 2, 2
HD = H // HEADS
CONFIG = {"vocab_size": VOCAB, "hidden_size": H, "intermediate_size": FFN, "num_hidden_layers": LAYERS,
          "num_attention_heads": HEADS, "num_key_value_heads": KV, "max_position_embeddings": 32}


def reference() -> dict[str, torch.Tensor]:
    """Hugging Face-style tensors of the model the NNM checkpoint holds."""
    g = torch.Generator().manual_seed(0)
    r = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    ref = {"embed": r(VOCAB, H), "norm": r(H), "lm_head": r(VOCAB, H)}
    for i in range(LAYERS):
        ref |= {f"{i}.q": r(HEADS * HD, H), f"{i}.k": r(KV * HD, H), f"{i}.v": r(KV * HD, H), f"{i}.o": r(H, HEADS * HD),
                f"{i}.gate": r(FFN, H), f"{i}.up": r(FFN, H), f"{i}.down": r(H, FFN), f"{i}.ln1": r(H), f"{i}.ln2": r(H)}
    return ref


def megatron_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Megatron's grouped rows: for each query group, its q heads, then its k head, then its v head."""
    per = HEADS // KV
    rows = []
    for grp in range(KV):
        rows += [q[(grp * per + j) * HD:(grp * per + j + 1) * HD] for j in range(per)]
        rows += [k[grp * HD:(grp + 1) * HD], v[grp * HD:(grp + 1) * HD]]
    return torch.cat(rows)


def write_nnm(root: Path, ref: dict[str, torch.Tensor]) -> None:
    per_stage = LAYERS // PP
    for pp in range(PP):
        for tp in range(TP):
            def col(t: torch.Tensor, tp: int = tp) -> torch.Tensor:
                return t.chunk(TP, 0)[tp].clone()

            def row(t: torch.Tensor, tp: int = tp) -> torch.Tensor:
                return t.chunk(TP, 1)[tp].clone()

            sd: dict[str, torch.Tensor] = {}
            for local in range(per_stage):
                i = pp * per_stage + local
                p = f"model.language_model.encoder.layers.{local}."
                sd[p + "input_layernorm.weight"] = ref[f"{i}.ln1"].clone()
                sd[p + "post_attention_layernorm.weight"] = ref[f"{i}.ln2"].clone()
                sd[p + "self_attention.query_key_value.weight"] = col(megatron_qkv(ref[f"{i}.q"], ref[f"{i}.k"], ref[f"{i}.v"]))
                sd[p + "self_attention.core_attention.rotary_pos_emb.inv_freq"] = torch.ones(HD // 2)
                sd[p + "self_attention.dense.weight"] = row(ref[f"{i}.o"])
                if pp == 0:  # NNM's separate gate / up projections
                    sd[p + "mlp.dense_h_to_4h.weight"] = col(ref[f"{i}.gate"])
                    sd[p + "mlp.dense_h_to_4h_2.weight"] = col(ref[f"{i}.up"])
                else:  # NeMo's fused one: each TP shard is [gate shard; up shard]
                    sd[p + "mlp.dense_h_to_4h.weight"] = torch.cat([col(ref[f"{i}.gate"]), col(ref[f"{i}.up"])])
                sd[p + "mlp.dense_4h_to_h.weight"] = row(ref[f"{i}.down"])
            if pp == 0:
                sd["model.language_model.embedding.word_embeddings.weight"] = col(ref["embed"])
            if pp == PP - 1:
                sd["model.language_model.encoder.final_layernorm.weight"] = ref["norm"].clone()
                sd["model.language_model.output_layer.weight"] = col(ref["lm_head"])
            folder = root / f"tp_rank_{tp:02d}_pp_rank_{pp:03d}"
            folder.mkdir(parents=True)
            torch.save({"state_dict": sd, "optimizer_states": [], "hyper_parameters": {"cfg": {
                "num_layers": LAYERS, "hidden_size": H, "num_attention_heads": HEADS, "num_kv_heads": KV,
                "ffn_hidden_size": FFN, "max_position_embeddings": 32}}}, folder / "model_optim_rng.ckpt")


def expected_local(ref: dict[str, torch.Tensor], tp_rank: int) -> dict[str, torch.Tensor]:
    """What nxd's Llama holds at TP=2 on ``tp_rank`` (column shards on rows, row shards on columns,
    fused q/k/v and gate/up each sharded piece by piece)."""
    c = lambda t: t.chunk(TP, 0)[tp_rank]  # noqa: E731
    out = {"model.embed_tokens.weight": c(ref["embed"]), "model.norm.weight": ref["norm"], "lm_head.weight": c(ref["lm_head"])}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out |= {p + "input_layernorm.weight": ref[f"{i}.ln1"], p + "post_attention_layernorm.weight": ref[f"{i}.ln2"],
                p + "self_attn.qkv_proj.weight_qkv": torch.cat([c(ref[f"{i}.q"]), c(ref[f"{i}.k"]), c(ref[f"{i}.v"])]),
                p + "self_attn.o_proj.weight": ref[f"{i}.o"].chunk(TP, 1)[tp_rank],
                p + "mlp.gate_up_proj.weight": torch.cat([c(ref[f"{i}.gate"]), c(ref[f"{i}.up"])]),
                p + "mlp.down_proj.weight": ref[f"{i}.down"].chunk(TP, 1)[tp_rank]}
    return out


def _load_tp2(ckpt_dir: str) -> dict[str, object]:
    import nxd
    from nxd_core_parallel import parallel_state
    from nxd_models_llama import LlamaForCausalLM

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    model = parallelize_model(LlamaForCausalLM(dict(CONFIG)))
    nxd.load_checkpoint(ckpt_dir, "converted", model=model)
    expected = expected_local(reference(), parallel_state.get_tensor_model_parallel_rank())
    state = model.state_dict()
    assert sorted(state) == sorted(expected), sorted(set(state) ^ set(expected))
    return {"differ": sorted(k for k, v in expected.items() if not torch.equal(state[k], v))}


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("nnm")
    write_nnm(tmp / "nnm", reference())
    out = tmp / "nxd"
    # the model config comes from the NNM checkpoint's hyper_parameters
    assert nxd_main(["ckpt", "convert", "--from", "nnm", "--to", "nxd", "--input", str(tmp / "nnm"),
                     "--output", str(out), "--tag", "converted"]) == 0
    assert (out / "converted" / "done").is_file()
    return out


def test_nnm_checkpoint_converts_to_the_full_state(converted: Path) -> None:
    from nxd_ckpt import full_model_state

    full = full_model_state(str(converted), "converted")
    ref = reference()
    expected = {"model.embed_tokens.weight": ref["embed"], "model.norm.weight": ref["norm"], "lm_head.weight": ref["lm_head"]}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        expected |= {p + "input_layernorm.weight": ref[f"{i}.ln1"], p + "post_attention_layernorm.weight": ref[f"{i}.ln2"],
                     p + "self_attn.qkv_proj.weight_qkv": torch.cat([ref[f"{i}.q"], ref[f"{i}.k"], ref[f"{i}.v"]]),
                     p + "self_attn.o_proj.weight": ref[f"{i}.o"], p + "mlp.down_proj.weight": ref[f"{i}.down"],
                     p + "mlp.gate_up_proj.weight": torch.cat([ref[f"{i}.gate"], ref[f"{i}.up"]])}
    assert sorted(full) == sorted(expected)
    assert all(torch.equal(full[k], v) for k, v in expected.items())


def test_nnm_checkpoint_loads_at_tp2_with_equal_tensors(rank_pool, converted: Path) -> None:
    # every tensor, the fused gate_up_proj ([gate_r; up_r] per rank) included
    results = rank_pool(2).run(_load_tp2, str(converted))
    assert all(r["differ"] == [] for r in results), results


def test_bad_nnm_checkpoints_are_named(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_nnm(tmp_path / "nnm", reference())
    (tmp_path / "nnm" / "tp_rank_01_pp_rank_001" / "model_optim_rng.ckpt").unlink()
    assert nxd_main(["migrate", "checkpoint", "--input", str(tmp_path / "nnm"), "--output", str(tmp_path / "o")]) == 1
    assert "tp_rank_01_pp_rank_001" in capsys.readouterr().err
    assert nxd_main(["migrate", "checkpoint", "--input", str(tmp_path / "nothing"), "--output", str(tmp_path / "o")]) == 1
    assert "not a directory" in capsys.readouterr().err
