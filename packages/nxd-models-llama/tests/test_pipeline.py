"""The Llama under nxd-pipeline (a test-only dependency): PP=2 with the 1F1B schedule on two gloo
ranks against the same model, same weights, in one process (PP=1).

Both sides build the model from one seed; the reference runs the ordinary ``forward`` (the loss
is the mean over every token of the batch), the pipelined one ``run_train`` over 4 micro-batches
of equal token counts, whose mean is the same quantity. Covers explicit ``position_ids`` and a
packed-sequence ``segment_ids`` mask (recomputed per stage from the batch) and tied embeddings
(the tied weight lives on both stages, its gradient is summed over them).
"""

from __future__ import annotations

import pytest
import torch

from nxd.transforms import parallelize_model

TOL = 1e-5
CONFIG = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, initializer_range=0.1)


def _batch(tied: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, CONFIG["vocab_size"], (8, 13), generator=g)
    data = {"input_ids": ids[:, :-1].contiguous(), "labels": ids[:, 1:].contiguous()}
    if tied:  # two packed documents per row, positions restarting at the second
        data["segment_ids"] = torch.tensor([1] * 7 + [2] * 5).repeat(8, 1)
        data["position_ids"] = torch.cat([torch.arange(7), torch.arange(5)]).repeat(8, 1)
    return data


def _build(tied: bool):
    from nxd_models_llama import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return parallelize_model(LlamaForCausalLM(LlamaConfig.from_dict(dict(CONFIG, tie_word_embeddings=tied))))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def pp_body(tied: bool) -> dict:
    from nxd_core_parallel import parallel_state
    from nxd_pipeline import NxDPPModel

    data = _batch(tied)
    # PP=1 reference on every rank (TP=1, DP=2 state), then the same weights at PP=2
    parallel_state.initialize_model_parallel(1, 1)
    reference = _build(tied)
    ref_loss = reference(**data).loss
    ref_loss.backward()
    ref_grads = {n: p.grad for n, p in reference.named_parameters(remove_duplicate=False)}
    parallel_state.destroy_model_parallel()

    parallel_state.initialize_model_parallel(1, 2)
    model = NxDPPModel(_build(tied), 2, {"num_microbatches": 4, "schedule": "1f1b"})
    loss = model.run_train(**data)
    grads = {}
    for name, p in model.local_module().named_parameters(remove_duplicate=False):
        assert p.grad is not None, f"no gradient for {name}"
        grads[name] = _rel(p.grad, ref_grads[name])
    return {"loss": _rel(loss, ref_loss.detach()), "grads": grads, "all": sorted(ref_grads),
            "stage": parallel_state.get_pipeline_model_parallel_rank()}


@pytest.mark.parametrize("tied", [False, True])
def test_llama_pp2_1f1b_matches_pp1(rank_pool, tied):
    per_rank = rank_pool(2).run(pp_body, tied)
    checked = [name for r in per_rank for name in r["grads"]]
    assert sorted(checked) == per_rank[0]["all"]  # each parameter is checked on exactly one stage
    assert {r["stage"] for r in per_rank} == {0, 1}
    worst_loss = max(r["loss"] for r in per_rank)
    worst_grad = max(v for r in per_rank for v in r["grads"].values())
    print(f"\nLlama PP=2 1f1b vs PP=1 (tied={tied}): loss rel {worst_loss:.2e}, grads rel {worst_grad:.2e}")
    assert worst_loss <= TOL and worst_grad <= TOL


def export_body(out_dir: str) -> dict:
    """One 1F1B step at PP=2, then the HF export at PP=2, against the same weights at PP=1 (each
    stage's ``state_dict`` merged: global layer names) exported and run by nxd; transformers runs
    the folder in the test's process."""
    import torch.distributed as dist
    from safetensors.torch import load_file

    from nxd_core_parallel import parallel_state
    from nxd_models_llama import collect_hf_state_dict, load_hf_checkpoint, save_hf_checkpoint
    from nxd_pipeline import NxDPPModel, merge_stage_state_dicts

    out = {}
    for tied in (False, True):
        parallel_state.initialize_model_parallel(1, 2)
        model = NxDPPModel(_build(tied), 2, {"num_microbatches": 2, "schedule": "1f1b"})
        model.run_train(**_batch(tied))
        with torch.no_grad():  # trained: every stage's weights move away from the shared init
            for p in model.parameters():
                p -= 0.5 * p.grad
        folder = f"{out_dir}/pp2_tied{tied}"
        save_hf_checkpoint(model, folder)
        returned = collect_hf_state_dict(model)
        # and back: strict import at PP=2 (each stage reads its layers; the others' count as read)
        fresh = NxDPPModel(_build(tied), 2, {"num_microbatches": 2, "schedule": "1f1b"})
        with torch.no_grad():
            for p in fresh.parameters():
                p.zero_()
        load_hf_checkpoint(fresh, folder)
        trained = model.state_dict()
        reloaded = all(torch.equal(v, trained[k]) for k, v in fresh.state_dict().items())
        stages = [None, None]
        dist.all_gather_object(stages, {k: v.detach().clone() for k, v in model.state_dict().items()})
        parallel_state.destroy_model_parallel()

        parallel_state.initialize_model_parallel(1, 1)
        reference = _build(tied)
        reference.load_state_dict(merge_stage_state_dicts(stages))
        want = collect_hf_state_dict(reference)
        parallel_state.destroy_model_parallel()
        if dist.get_rank() != 0:
            out[tied] = {"returned": len(returned), "reloaded": reloaded}
            continue
        got = load_file(f"{folder}/model.safetensors")
        ids = _batch(tied)["input_ids"]
        out[tied] = {"returned": len(returned), "reloaded": reloaded, "keys": sorted(got) == sorted(want),
                     "equal": all(torch.equal(got[k], want[k]) for k in want), "folder": folder, "ids": ids,
                     "logits": reference(ids).logits.detach()}
    return out


def test_llama_pp2_hf_export_matches_pp1(rank_pool, tmp_path):
    """Each stage exports its own layers (global indices), gathered to global rank 0: the folder
    equals the PP=1 export bit for bit and transformers gives the PP=1 logits (tied and untied);
    a strict import of it at PP=2 gives back every stage's trained weights exactly."""
    from nxd_testing.reference import quiet_transformers, rel_err

    quiet_transformers()
    from transformers import AutoModelForCausalLM

    first, second = rank_pool(2).run(export_body, str(tmp_path))
    for tied in (False, True):
        assert second[tied]["returned"] == 0  # not the writer: nothing returned, nothing written
        assert first[tied]["reloaded"] and second[tied]["reloaded"]
        r = first[tied]
        assert r["returned"] > 0 and r["keys"] and r["equal"]
        with torch.no_grad():
            logits = AutoModelForCausalLM.from_pretrained(r["folder"], dtype=torch.float32)(r["ids"]).logits
        err = rel_err(logits, r["logits"])
        print(f"\nLlama PP=2 HF export (tied={tied}) vs PP=1: transformers logits rel {err:.2e}")
        assert err <= TOL
