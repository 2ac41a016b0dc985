"""torchtitan 0.3.0's own code on the other side of nxd's torchtitan converter (nox -s interop).

torchtitan -> nxd: torchtitan's Llama 3 / Qwen3 (its ``debugmodel`` flavors, 2 layers, its SDPA
attention: FlexAttention has no backward on CPU) trains one step with its own optimizer and loss,
its ``CheckpointManager`` saves the full training state; ``nxd ckpt convert --from torchtitan``
makes nxd's model, which gives torchtitan's logits within 1e-5 and the same loss.

nxd -> torchtitan: nxd's Llama trains one step under FSDP (one process) and saves;
``nxd ckpt convert --from nxd --to torchtitan``; torchtitan's ``CheckpointManager(initial_load_path=...,
initial_load_model_only=True).load()`` fills torchtitan's model built from the converted folder
(``nxd_torchtitan.titan_config``, what ``--module nxd_torchtitan.titan_config --config nxd_checkpoint``
trains), which gives nxd's logits within 1e-5."""

from __future__ import annotations

import json
import os

import pytest
import torch
from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.components.loss import CrossEntropyLoss
from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw
from torchtitan.config import ConfigManager
from torchtitan.models import llama3, qwen3
from torchtitan.models.common.attention import ScaledDotProductAttention

import nxd
from nxd_ckpt.convert import run_convert, single_rank
from nxd_torchtitan import titan_config
from nxd_torchtitan.model_args import args_from_model_config, flavor_args

TOL = 1e-5


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def _tokens(vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (2, 33), generator=torch.Generator().manual_seed(seed))


def _titan_trains_and_saves(model_config, folder: str) -> tuple[torch.nn.Module, object]:
    torch.manual_seed(0)
    model = model_config.build()
    model.init_states(buffer_device=torch.device("cpu"))
    optimizers = default_adamw(lr=1e-3).build(model_parts=[model])
    schedulers = LRSchedulersContainer.Config(warmup_steps=1).build(optimizers=optimizers, training_steps=4)
    loss_fn = CrossEntropyLoss.Config().build()
    tokens = _tokens(model_config.vocab_size, 1)
    loss, _ = loss_fn(model(tokens[:, :-1]), tokens[:, 1:])
    loss.backward()
    optimizers.step()
    schedulers.step()
    checkpointer = CheckpointManager.Config(enable=True, last_save_model_only=False).build(
        dataloader=None, model_parts=[model], optimizers=optimizers, lr_schedulers=schedulers, states={},
        sd_adapter=None, base_folder=folder)
    checkpointer.save(curr_step=1, last_step=True)
    checkpointer.close()
    return model, loss_fn


def _debug_config(module, layers: int = 2):
    config = module.model_registry("debugmodel").model
    config.layers = config.layers[:layers]
    for layer in config.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    return config


@pytest.mark.parametrize("module", [llama3, qwen3], ids=["llama3", "qwen3"])
def test_torchtitan_checkpoint_loads_into_nxd(tmp_path, module):
    config = _debug_config(module)
    titan, loss_fn = _titan_trains_and_saves(config, str(tmp_path / "dump"))
    args = args_from_model_config(config)
    (tmp_path / "args.json").write_text(json.dumps(args.to_dict()))

    full = run_convert("torchtitan", "full", str(tmp_path / "dump" / "checkpoint"), str(tmp_path / "nxd.pt"),
                       config_path=str(tmp_path / "args.json"))
    tokens = _tokens(config.vocab_size)
    with torch.no_grad():
        titan_logits = titan(tokens[:, :-1])
        titan_loss = loss_fn(titan_logits, tokens[:, 1:])[0] / tokens[:, 1:].numel()  # its loss is a sum
    with single_rank() as context:
        model = nxd.build_parallel_model(nxd.get_model(full.model), full.config, context=context)
        model.load_state_dict(full.state)
        with torch.no_grad():
            out = model(tokens[:, :-1], labels=tokens[:, 1:])
    diff, loss_diff = _rel(out.logits, titan_logits), abs(float(out.loss - titan_loss)) / float(titan_loss)
    print(f"torchtitan {module.__name__.rsplit('.', 1)[-1]} -> nxd: logits max rel diff {diff:.1e}, loss "
          f"{float(titan_loss):.6f} vs {float(out.loss):.6f}")
    assert diff < TOL and loss_diff < TOL


def test_torchtitan_flavors_map_to_nxd_configs():
    """torchtitan's own flavors read into nxd's numbers (norm eps, RoPE scaling, FFN width) without
    building them: Llama 3 8B and Qwen3 0.6B."""
    llama = flavor_args("llama3", "8B")
    assert (llama.dim, llama.n_kv_heads, llama.hidden_dim, llama.norm_eps) == (4096, 8, 14336, 1e-5)
    assert llama.rope_scaling == {"scaling_factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 8192}
    qwen = flavor_args("qwen3", "0.6B")
    assert (qwen.head_dim, qwen.norm_eps, qwen.enable_weight_tying, qwen.rope_scaling) == (128, 1e-6, True, None)


def _nxd_trains_and_saves(config: dict, folder: str) -> torch.Tensor:
    """One FSDP step of nxd's Llama (one process), saved with nxd.save_checkpoint; returns its logits."""
    spec = nxd.get_model("llama")
    with single_rank():
        cfg = nxd.neuronx_distributed_config(data_parallel_strategy="fsdp")
        torch.manual_seed(0)
        model = nxd.initialize_parallel_model(cfg, lambda: spec.build(spec.config_from_dict(config), cfg))
        optimizer = nxd.initialize_parallel_optimizer(cfg, torch.optim.AdamW, model.parameters(), lr=1e-3)
        tokens = _tokens(config["vocab_size"], 2)
        model.run_train(tokens[:, :-1], tokens[:, 1:])
        optimizer.step()
        nxd.save_checkpoint(folder, "step1", model=model, optimizer=optimizer)
        with torch.no_grad():
            return model(_tokens(config["vocab_size"])[:, :-1]).logits.detach().clone()


def test_nxd_fsdp_checkpoint_resumes_in_torchtitan(tmp_path, monkeypatch):
    config = dict(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=500000.0,
                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    nxd_logits = _nxd_trains_and_saves(config, str(tmp_path / "ckpt"))
    (tmp_path / "config.json").write_text(json.dumps(config))
    out = str(tmp_path / "titan")
    run_convert("nxd", "torchtitan", str(tmp_path / "ckpt"), out, model="llama", tag="step1",
                config_path=str(tmp_path / "config.json"))

    # the documented command's config, parsed by torchtitan's own ConfigManager (what torchtitan.train does)
    monkeypatch.setenv(titan_config.CHECKPOINT_ENV, out)
    trainer_config = ConfigManager().parse_args(["--module", "nxd_torchtitan.titan_config", "--config",
                                                 "nxd_checkpoint", "--training.steps", "3"])
    assert trainer_config.checkpoint.initial_load_path == os.path.abspath(out)
    assert trainer_config.checkpoint.initial_load_model_only and trainer_config.training.steps == 3
    args = titan_config.read_args(out)
    assert args.norm_eps == 1e-6 and args.hidden_dim == 160
    assert args_from_model_config(trainer_config.model_spec.model) == args  # the model torchtitan would train
    model_config = titan_config.model_config(args, attention="sdpa")
    torch.manual_seed(1)
    model = model_config.build()
    model.init_states(buffer_device=torch.device("cpu"))
    optimizers = default_adamw().build(model_parts=[model])
    checkpointer = CheckpointManager.Config(enable=True, folder="checkpoint", initial_load_path=out,
                                            initial_load_model_only=True).build(
        dataloader=None, model_parts=[model], optimizers=optimizers,
        lr_schedulers=LRSchedulersContainer.Config().build(optimizers=optimizers, training_steps=2), states={},
        sd_adapter=None, base_folder=str(tmp_path / "resume"))
    assert checkpointer.load()
    checkpointer.close()
    with torch.no_grad():
        titan_logits = model(_tokens(config["vocab_size"])[:, :-1])
    diff = _rel(titan_logits, nxd_logits)
    print(f"nxd (FSDP) -> torchtitan llama3: logits max rel diff {diff:.1e}")
    assert diff < TOL
