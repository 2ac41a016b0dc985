"""One family through ``nxd train`` as a user runs it, from an HF folder nxd has no plugin for
(OLMo 2): chosen by its model_type, validated at TP=2 by the ranks' own build (nxd-plan's rank
check: meta model, TP plan, HF load from the headers), refused before launch where it cannot run,
trained 2 steps with a checkpoint per step, resumed from step 1 to the same step-2 weights bit for
bit, converted with ``nxd ckpt convert --to hf``, and transformers' logits on the export equal nxd's.
The run itself is one process (one device: in-process, no torchrun). The same journey for every other
family (Gemma 3: tied, scaled embedding and sliding layers; Phi-3: fused projections; Granite:
multipliers; StarCoder 2: biases, tied head; GPT-OSS: MoE with its router loss, no TP plan) runs at
FSDP=2 on the rank pool, Gemma 3's and OLMo 2's at PP=2 (nxd-pipeline's split of transformers'
forward), and Granite's with one K/V head at TP=2 (replicated on both ranks): the ranks do what ``nxd train``'s workers do (``prepare_run`` + ``write_run_config``, then
``Trainer(config).fit()``), with no launch per family."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from families import FAMILIES, save_family

from nxd.cli import main

VOCAB, SEQ = 512, 16


def small_corpus(out: Path) -> dict[str, str]:
    """A tokenizer and indexed dataset from the first 300 documents of the embedded corpus (the
    whole quickstart corpus costs a minute of tokenizer training on 2 cores)."""
    from itertools import islice

    from nxd_data.corpus import iter_corpus
    from nxd_data.prepare import prepare_dataset
    from nxd_data.train_tokenizer import train_bpe_tokenizer

    out.mkdir(parents=True)
    docs = list(islice(iter_corpus(), 300))
    (out / "corpus.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    train_bpe_tokenizer(docs, VOCAB, str(out / "tokenizer"))
    prepare_dataset([out / "corpus.jsonl"], str(out / "tokenizer"), str(out / "text_document"), progress=False)
    return {"tokenizer": str(out / "tokenizer"), "data_prefix": str(out / "text_document")}


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cli")
    corpus = small_corpus(root / "corpus")
    folders = {t: save_family(t, root / t, vocab_size=VOCAB, max_position_embeddings=64) for t in FAMILIES}
    # one K/V head: replicated over TP=2 (kv_size_multiplier 2)
    folders["granite_1kv"] = save_family("granite", root / "granite_1kv", vocab_size=VOCAB, max_position_embeddings=64,
                                         num_key_value_heads=1)
    config = {
        "name": "tiny", "seed": 7,
        "trainer": {"devices": 1, "max_steps": 2, "log_every_n_steps": 1, "val_check_interval": 0,
                    "limit_val_batches": 1, "enable_progress_bar": False, "accelerator": "cpu"},
        "exp_manager": {"explicit_log_dir": str(root / "run"), "create_tensorboard_logger": False,
                        "checkpoint_callback_params": {"every_n_train_steps": 1, "save_top_k": -1}},
        "distributed_strategy": {"tensor_model_parallel_size": 1},
        "data": {"module": "indexed", "data_prefix": corpus["data_prefix"], "tokenizer": corpus["tokenizer"],
                 "micro_batch_size": 2, "global_batch_size": 2, "seq_length": SEQ, "splits_string": "950,50,0"},
        "model": {"pretrained_checkpoint": str(folders["olmo2"]),
                  "optim": {"name": "adamw", "lr": 1e-2, "sched": {"name": "constant"}}},
        "precision": {"type": "fp32"},
    }
    (root / "cfg.yaml").write_text(yaml.safe_dump(config))
    return {"root": root, "cfg": root / "cfg.yaml", **folders}


def _refusal(capsys, *args: str) -> str:
    assert main(["train", *args, "--validate"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_validated_by_the_ranks_build_and_refused_before_launch(setup, capsys) -> None:
    cfg, tp2 = str(setup["cfg"]), ["trainer.devices=2", "distributed_strategy.tensor_model_parallel_size=2"]
    assert main(["train", cfg, *tp2, "--validate"]) == 0
    assert "model 'transformers' (model.model_config (model_type 'olmo2', which no nxd family lists" in \
        capsys.readouterr().out
    assert main(["train", cfg, "trainer.devices=4", "distributed_strategy.tensor_model_parallel_size=2",
                 "distributed_strategy.pipeline_model_parallel_size=2", "data.global_batch_size=4", "--validate"]) == 0
    capsys.readouterr()
    router_loss = setup["root"] / "gpt_oss_router_loss.json"
    router_loss.write_text(json.dumps({**json.loads((setup["gpt_oss"] / "config.json").read_text()),
                                       "output_router_logits": True}))
    assert ("pipeline_model_parallel_size=2: GptOssForCausalLM (model_type 'gpt_oss') adds a router load-balancing "
            "loss over all its layers") in _refusal(capsys, cfg, "trainer.devices=2", "model.pretrained_checkpoint=null",
                                                     f"model.model_config={router_loss}",
                                                     "distributed_strategy.pipeline_model_parallel_size=2")
    assert "sequence_parallel: Olmo2ForCausalLM (model_type 'olmo2')'s norms and residuals run on whole sequences" in \
        _refusal(capsys, cfg, *tp2, "distributed_strategy.sequence_parallel=true")
    assert "tensor_model_parallel_size=2: GptOssForCausalLM (model_type 'gpt_oss') has no tensor-parallel plan" in \
        _refusal(capsys, cfg, *tp2, f"model.pretrained_checkpoint={setup['gpt_oss']}")
    assert "model.hidden_size=64 disagrees with the model's config.json (hidden_size=32)" in \
        _refusal(capsys, cfg, "model.hidden_size=64")
    assert "model.meta_device_init: Olmo2ForCausalLM is built with transformers' own initialisation" in \
        _refusal(capsys, cfg, "trainer.devices=2", "distributed_strategy.fsdp=true", "data.global_batch_size=4",
                 "model.meta_device_init=true")


@pytest.mark.launch
def test_hf_folder_trains_resumes_bitwise_and_exports_to_transformers(setup, capsys) -> None:
    from nxd_ckpt.consolidate import full_model_state

    root, cfg = setup["root"], str(setup["cfg"])
    assert main(["train", cfg]) == 0
    assert f"initialised from HF weights {setup['olmo2']}" in capsys.readouterr().out
    ckpts = root / "run" / "checkpoints"
    step1, step2 = (next(ckpts.glob(f"tiny--step={s}-*")).name for s in (1, 2))
    # the same run resumed from its step-1 checkpoint into another folder reaches step 2's weights exactly
    assert main(["train", cfg, f"exp_manager.explicit_log_dir={root / 'resumed'}", "model.pretrained_checkpoint=null",
                 f"model.model_config={setup['olmo2'] / 'config.json'}", f"exp_manager.resume_from_checkpoint={ckpts / step1}"]) == 0
    first, again = full_model_state(str(ckpts), step2), full_model_state(str(root / "resumed" / "checkpoints"), step2)
    assert sorted(first) == sorted(again) and [k for k in first if not torch.equal(first[k], again[k])] == []

    assert_export_equals_nxd(root / "run", first, root / "hf_export", "Olmo2ForCausalLM")


def assert_export_equals_nxd(run: Path, state: dict[str, torch.Tensor], out: Path, hf_class: str) -> None:
    """``nxd ckpt convert --to hf`` of ``run``; transformers on the export and nxd's model holding
    ``state`` give the same logits exactly."""
    from transformers import AutoModelForCausalLM

    import nxd

    assert main(["ckpt", "convert", "--from", "nxd", "--to", "hf", str(run), "--output", str(out)]) == 0
    spec = nxd.get_model("transformers")
    model = spec.build(json.loads((out / "config.json").read_text()))
    model.load_state_dict(state, strict=True)  # nxd's model with the run's last weights
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(0))
    exported = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    assert type(exported).__name__ == hf_class
    diff = float((exported(ids).logits - model(ids).logits).abs().max())
    print(f"\n{hf_class}: transformers on the export vs nxd: max abs logits diff {diff:.2e}")
    assert diff == 0.0


def trainer_fit(config_path: str) -> dict:
    """One rank: what ``python -m nxd_training.worker <run>/config.yaml`` does."""
    from nxd_training.config import load_resolved
    from nxd_training.loop import Trainer

    trainer = Trainer(load_resolved(config_path))
    try:
        return {"losses": trainer.fit().losses}
    finally:
        trainer.close()


def fit_on_pool(pool, cfg: str, overrides: list[str]) -> dict[int, float]:
    """``nxd train CFG OVERRIDES`` with the launch replaced by the pool's ranks: the step losses."""
    from nxd_training.cli import prepare_run
    from nxd_training.launcher import write_run_config

    run = prepare_run(cfg, overrides)
    return pool.run(trainer_fit, str(write_run_config(run.config, run.log_dir)), timeout=300)[0]["losses"]


#: family -> its transformers class
HF_CLASSES = {"gemma3_text": "Gemma3ForCausalLM", "phi3": "Phi3ForCausalLM", "olmo2": "Olmo2ForCausalLM",
              "granite": "GraniteForCausalLM", "starcoder2": "Starcoder2ForCausalLM", "gpt_oss": "GptOssForCausalLM",
              "granite_1kv": "GraniteForCausalLM"}
#: layout -> its overrides on 2 ranks (4 samples a step: 2 per DP rank, or 2 micro-batches of 2 under PP)
LAYOUTS = {"FSDP=2": ["trainer.devices=2", "distributed_strategy.fsdp=true", "data.global_batch_size=4"],
           "PP=2": ["trainer.devices=2", "distributed_strategy.pipeline_model_parallel_size=2",
                    "data.global_batch_size=4"],
           "TP=2": ["trainer.devices=2", "distributed_strategy.tensor_model_parallel_size=2"]}
#: FSDP=2 for every family but OLMo 2 (whose journey is the one-process ``nxd train`` above); PP=2 for
#: a tied one (the head's copy of the embedding on the last stage) and an untied one; TP=2 for Granite
#: with one K/V head (its K/V projections replicated: checkpoint, consolidation and export count one copy)
JOURNEYS = ([(f, "FSDP=2") for f in FAMILIES if f != "olmo2"] + [("gemma3_text", "PP=2"), ("olmo2", "PP=2")]
            + [("granite_1kv", "TP=2")])


@pytest.mark.parametrize("family,layout_name", JOURNEYS)
def test_family_trains_resumes_bitwise_and_exports(setup, rank_pool, tmp_path, family, layout_name) -> None:
    from nxd_ckpt.consolidate import full_model_state

    cfg, layout, hf_class = str(setup["cfg"]), LAYOUTS[layout_name], HF_CLASSES[family]
    run, resumed = tmp_path / "run", tmp_path / "resumed"
    first = fit_on_pool(rank_pool(2), cfg, [*layout, f"model.pretrained_checkpoint={setup[family]}",
                                            f"exp_manager.explicit_log_dir={run}"])
    ckpts = run / "checkpoints"
    step1, step2 = (next(ckpts.glob(f"tiny--step={s}-*")).name for s in (1, 2))
    again = fit_on_pool(rank_pool(2), cfg, [*layout, "model.pretrained_checkpoint=null", f"model.model_config={setup[family] / 'config.json'}",
                                            f"exp_manager.explicit_log_dir={resumed}",
                                            f"exp_manager.resume_from_checkpoint={ckpts / step1}"])
    assert sorted(first) == [1, 2] and again == {2: first[2]}, (first, again)
    state, resumed_state = full_model_state(str(ckpts), step2), full_model_state(str(resumed / "checkpoints"), step2)
    assert sorted(state) == sorted(resumed_state) and [k for k in state if not torch.equal(state[k], resumed_state[k])] == []
    assert_export_equals_nxd(run, state, tmp_path / "hf_export", hf_class)
