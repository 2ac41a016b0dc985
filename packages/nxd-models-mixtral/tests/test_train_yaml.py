"""``nxd train`` of an NxD Training Mixtral config (hf_mixtral_8x7b_dropless_config.yaml's
``model.moe`` section and ``expert_model_parallel_size``, at tiny size) on 2 gloo ranks: EP=2 learns,
and the same config at PP=2 (DP=1, two micro-batches per step) follows the EP=2 run's losses. Both
log the language-model and load-balancing losses beside the loss (``lm_loss``, ``aux_loss``); under
PP=2 they come from the last stage and reach rank 0's metrics.jsonl."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

#: hf_mixtral_8x7b_dropless_config.yaml's model.moe section, unchanged (aws-neuron/neuronx-distributed-training,
#: examples/conf, Apache-2.0) except num_experts (8 -> 4 for the tiny model)
NXDT_DROPLESS_MOE = {"num_experts": 4, "frequency": 1, "dropout": 0.0, "capacity_factor": 0.0, "dropless": True,
                     "routing_algorithm": "top_k", "top_k": 2, "output_router_logits": True,
                     "router_aux_loss_coef": 0.02, "normalize_top_k_affinities": True}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from nxd_data.quickstart import prepare_quickstart_data

    return prepare_quickstart_data(tmp_path_factory.mktemp("corpus"), vocab_size=512)


def mixtral_config(corpus: dict[str, str], exp_dir: Path, ep: int, pp: int = 1, steps: int = 12) -> dict[str, Any]:
    return {
        "name": "hf_mixtral_dropless", "model_source": "hf", "seed": 1234,
        "trainer": {"devices": 2, "max_steps": steps, "log_every_n_steps": 1, "val_check_interval": 0,
                    "limit_val_batches": 0, "gradient_clip_val": 1.0, "enable_progress_bar": False,
                    "accelerator": "cpu"},
        "exp_manager": {"exp_dir": str(exp_dir), "create_checkpoint_callback": False,
                        "create_tensorboard_logger": False},
        "distributed_strategy": {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": pp,
                                 "zero1": False, "sequence_parallel": False, "expert_model_parallel_size": ep},
        "data": {"module": "indexed", "data_prefix": corpus["data_prefix"], "tokenizer": corpus["tokenizer"],
                 "micro_batch_size": 2, "global_batch_size": 4, "seq_length": 32, "splits_string": "950,50,0"},
        "model": {"vocab_size": 512, "hidden_size": 32, "ffn_hidden_size": 48, "num_layers": 2,
                  "num_attention_heads": 4, "num_kv_heads": 2, "max_position_embeddings": 64, "rope_theta": 1e6,
                  "moe": dict(NXDT_DROPLESS_MOE),
                  "optim": {"name": "adamw", "lr": 1e-2, "sched": {"name": "constant"}}},
        "precision": {"type": "fp32"},
    }


def _train(config: dict[str, Any], log_dir: str) -> dict[str, Any]:
    from nxd_training.config import load_config
    from nxd_training.loop import train

    result = train(load_config(config), log_dir=log_dir)
    return {"losses": dict(result.losses), "metrics": dict(result.metrics)}


def _logged_terms(log_dir: str, split: str = "train") -> dict[int, dict[str, float]]:
    """Rank 0's metrics.jsonl: each step's loss, lm_loss and aux_loss."""
    from nxd_training.exp_manager import read_metrics

    return {r["step"]: {k: r[k] for k in ("loss", "lm_loss", "aux_loss")} for r in read_metrics(log_dir, split)}


def test_nxdt_mixtral_config_validates_and_selects_mixtral(corpus, tmp_path):
    from nxd_training.config import load_config, model_config_of, model_spec_of

    run = load_config(mixtral_config(corpus, tmp_path, ep=2)).run
    spec = model_spec_of(run)
    assert spec.name == "mixtral"
    model_config = model_config_of(run, spec)
    moe = model_config.moe_config()
    assert (moe.num_experts, moe.top_k, moe.dropless, moe.router_aux_loss_coef) == (4, 2, True, 0.02)
    assert model_config.output_router_logits


def _train_run_config(config_path: str) -> dict[str, Any]:
    """What a rank of ``nxd train`` does: train from the run directory's config.yaml."""
    from nxd_training.config.resolved import load_resolved
    from nxd_training.loop import train

    result = train(load_resolved(config_path))
    return {"losses": dict(result.losses), "metrics": dict(result.metrics), "valid": dict(result.valid_losses)}


@pytest.fixture(scope="module")
def ep2_run(rank_pool, corpus, tmp_path_factory) -> dict[str, Any]:
    from nxd_training.config import load_config
    from nxd_training.launcher import write_run_config

    tmp = tmp_path_factory.mktemp("ep2")
    config = mixtral_config(corpus, tmp / "runs", ep=2)
    # the run as nxd train leaves it (config.yaml, a checkpoint, validation at the end) for `nxd eval`
    config["trainer"].update(val_check_interval=12, limit_val_batches=2)
    config["exp_manager"].update(create_checkpoint_callback=True, checkpoint_callback_params={"every_n_train_steps": 12})
    path = write_run_config(load_config(config), tmp / "log")
    results = rank_pool(2).run(_train_run_config, str(path), timeout=900)
    assert results[0] == results[1]
    return {**results[0], "logged": _logged_terms(str(tmp / "log")), "log": tmp / "log"}


@pytest.mark.slow
def test_ep2_checkpoint_evaluates_in_one_process(ep2_run, capsys):
    """``nxd eval RUN_DIR`` of the EP=2 run's checkpoint at EP=1 in one process (experts resharded on load):
    the run's own validation loss and terms at that step."""
    import re

    from nxd.cli import main

    assert main(["eval", str(ep2_run["log"])]) == 0
    out = capsys.readouterr().out
    assert "(step 12, written at TP 1 x PP 1 x DP 2 x EP 2); model 'mixtral'; one process" in out, out
    loss = float(re.search(r"validation loss (\S+),", out).group(1))
    expected = ep2_run["valid"][12]
    print(f"\nnxd eval at EP=1 vs the EP=2 run's validation loss: {loss:.6f} vs {expected:.6f}")
    assert abs(loss - expected) <= 1e-5 * expected, (out, expected)
    assert "aux_loss" in out and "lm_loss" in out


@pytest.fixture(scope="module")
def ep2_losses(ep2_run) -> dict[int, float]:
    return ep2_run["losses"]


@pytest.mark.slow
def test_ep2_run_logs_lm_and_aux_losses_adding_up_to_the_loss(ep2_run):
    """The logged loss is lm_loss + router_aux_loss_coef x aux_loss (means over the DP ranks)."""
    coef = NXDT_DROPLESS_MOE["router_aux_loss_coef"]
    logged = ep2_run["logged"]
    assert sorted(logged) == list(range(1, 13))
    worst = max(abs(r["lm_loss"] + coef * r["aux_loss"] - r["loss"]) / abs(r["loss"]) for r in logged.values())
    print(f"\nEP=2 nxd train: loss vs lm_loss + {coef} aux_loss, worst relative difference over 12 steps {worst:.2e} "
          f"(step 1: lm {logged[1]['lm_loss']:.6f}, aux {logged[1]['aux_loss']:.6f})")
    assert worst < 1e-6
    assert all(ep2_run["metrics"][s] == {k: v for k, v in r.items() if k != "loss"} for s, r in logged.items())


@pytest.mark.slow
def test_ep2_run_learns(ep2_losses):
    first, last = (ep2_losses[1] + ep2_losses[2]) / 2, (ep2_losses[11] + ep2_losses[12]) / 2
    print(f"\nEP=2 nxd train: loss {first:.3f} -> {last:.3f}")
    assert last < first - 0.5, f"loss did not fall: {first:.3f} -> {last:.3f}"


@pytest.mark.slow
def test_pp2_run_follows_the_ep2_run(rank_pool, corpus, tmp_path, ep2_losses, ep2_run):
    """PP=2 x DP=1 runs each global batch as 2 micro-batches through the pipeline (router statistics
    carried between the stages); the EP=2 run (PP=1, DP=2) sees the same micro-batches, one per rank."""
    config = mixtral_config(corpus, tmp_path / "runs", ep=1, pp=2, steps=4)
    config["trainer"].update(val_check_interval=4, limit_val_batches=1)  # one validation group (run_eval)
    results = rank_pool(2).run(_train, config, str(tmp_path / "pp2"), timeout=900)
    losses = [r["losses"] for r in results]
    assert losses[0] == losses[1] and sorted(losses[0]) == [1, 2, 3, 4]
    worst = max(abs(losses[0][s] - ep2_losses[s]) / abs(ep2_losses[s]) for s in losses[0])
    print(f"\nPP=2 nxd train vs EP=2: worst relative loss difference over 4 steps {worst:.2e}")
    assert worst < 1e-5
    # the last stage's lm/aux losses: on both pipeline ranks, and in rank 0's (the first stage's) log
    assert results[0]["metrics"] == results[1]["metrics"]
    logged, reference = _logged_terms(str(tmp_path / "pp2")), ep2_run["logged"]
    assert sorted(logged) == [1, 2, 3, 4]
    terms = {name: max(abs(logged[s][name] - reference[s][name]) / abs(reference[s][name]) for s in logged)
             for name in ("lm_loss", "aux_loss")}
    print(f"PP=2 vs EP=2 logged terms, worst relative difference over 4 steps: {terms}")
    assert all(err < 1e-5 for err in terms.values()), terms
    valid = _logged_terms(str(tmp_path / "pp2"), "valid")[4]
    coef = NXDT_DROPLESS_MOE["router_aux_loss_coef"]
    assert abs(valid["lm_loss"] + coef * valid["aux_loss"] - valid["loss"]) / valid["loss"] < 1e-6, valid


@pytest.mark.launch
def test_trained_run_converts_to_hf_with_no_arguments(corpus, tmp_path, capsys):
    """A user's path back to Hugging Face: ``nxd train`` (the NxDT Mixtral config, one rank), then
    ``nxd ckpt convert --from nxd --to hf RUN_DIR`` alone; transformers loads the folder and gives
    the trained model's logits."""
    import torch
    import yaml
    from transformers import AutoModelForCausalLM

    import nxd
    from nxd.cli import main
    from nxd_ckpt.consolidate import full_model_state, resolve_tag
    from nxd_ckpt.convert import read_user_content, single_rank

    config = mixtral_config(corpus, tmp_path / "runs", ep=1, steps=2)
    config["trainer"]["devices"] = 1
    config["exp_manager"].update({"create_checkpoint_callback": True, "explicit_log_dir": str(tmp_path / "run"),
                                  "checkpoint_callback_params": {"every_n_train_steps": 2}})
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["train", str(path)]) == 0
    assert main(["ckpt", "convert", "--from", "nxd", "--to", "hf", str(tmp_path / "run")]) == 0
    ckpt = str(tmp_path / "run" / "checkpoints")
    tag = resolve_tag(ckpt, None)
    record = read_user_content(ckpt, tag)["nxd_model"]
    ids = torch.tensor([[1, 5, 9, 23, 77, 4, 301, 2]])
    spec = nxd.get_model(record["name"])
    with single_rank():
        model = nxd.build_parallel_model(spec, record["config"])
        model.load_state_dict(full_model_state(ckpt, tag))
        with torch.no_grad():
            ours = model.eval()(ids).logits.float()
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "hf" / tag, torch_dtype=torch.float32).eval()
    assert type(hf).__name__ == "MixtralForCausalLM"
    with torch.no_grad():
        theirs = hf(ids).logits.float()
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4 * float(ours.abs().max()))
