"""torchtitan's side: its 0.3.0 model config and training config for a model nxd converted.

Needs torchtitan 0.3.0 installed (``pip install nxd-torchtitan[torchtitan]``); nothing else in
nxd-torchtitan imports it. The model is built with torchtitan's own layer builders and flavors'
initialisers (so torchtitan trains it as it trains its flavors), its numbers from
:class:`~nxd_torchtitan.model_args.TitanArgs`.

As a torchtitan ``--module`` (its ``ConfigManager`` imports a dotted module and calls the named
function)::

    NXD_TORCHTITAN_CHECKPOINT=converted/ torchrun --nproc_per_node 8 -m torchtitan.train \\
        --module nxd_torchtitan.titan_config --config nxd_checkpoint \\
        --hf_assets_path ./tokenizer --dataloader.dataset c4 --training.steps 1000

starts torchtitan's trainer on the converted model, its weights loaded by ``CheckpointManager``
from ``initial_load_path`` = that folder, model only (docs/torchtitan.md)."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from torchtitan.models.common import ComplexRoPE, CosSinRoPE, Embedding, Linear, RMSNorm
from torchtitan.models.common.attention import ScaledDotProductAttention
from torchtitan.protocols.model_spec import ModelSpec

from nxd_torchtitan.model_args import ARGS_FILE, TitanArgs
from nxd_torchtitan.names import family

#: environment variable naming the folder ``nxd ckpt convert --to torchtitan`` wrote
CHECKPOINT_ENV = "NXD_TORCHTITAN_CHECKPOINT"


def _llama3(args: TitanArgs, backend: str) -> Any:
    from torchtitan.models import llama3

    rope = ComplexRoPE.Config(dim=args.head_dim, max_seq_len=args.max_seq_len, theta=args.rope_theta,
                              **({"scaling": "llama", **args.rope_scaling} if args.rope_scaling else {}))
    layers = llama3._build_llama3_layers(n_layers=args.n_layers, dim=args.dim, n_heads=args.n_heads,
                                        n_kv_heads=args.n_kv_heads, hidden_dim=args.hidden_dim, rope=rope,
                                        attn_backend=backend)
    return llama3.Llama3Model.Config(
        dim=args.dim, vocab_size=args.vocab_size, enable_weight_tying=args.enable_weight_tying,
        tok_embeddings=Embedding.Config(num_embeddings=args.vocab_size, embedding_dim=args.dim,
                                        param_init=llama3._EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=args.dim, param_init=llama3._NORM_INIT),
        lm_head=Linear.Config(in_features=args.dim, out_features=args.vocab_size,
                              param_init=llama3._output_linear_init(args.dim)),
        layers=layers)


def _qwen3(args: TitanArgs, backend: str) -> Any:
    from torchtitan.models import qwen3

    rope = CosSinRoPE.Config(dim=args.head_dim, max_seq_len=args.max_seq_len, theta=args.rope_theta)
    layers = qwen3._build_qwen3_layers(n_layers=args.n_layers, dim=args.dim, n_heads=args.n_heads,
                                       n_kv_heads=args.n_kv_heads, head_dim=args.head_dim, hidden_dim=args.hidden_dim,
                                       attn_backend=backend, rope=rope)
    return qwen3.Qwen3Model.Config(
        dim=args.dim, vocab_size=args.vocab_size, enable_weight_tying=args.enable_weight_tying,
        tok_embeddings=Embedding.Config(num_embeddings=args.vocab_size, embedding_dim=args.dim,
                                        param_init=qwen3._EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=args.dim, param_init=qwen3._NORM_INIT),
        lm_head=Linear.Config(in_features=args.dim, out_features=args.vocab_size, param_init=qwen3._LINEAR_INIT),
        layers=layers)


def model_config(args: TitanArgs, attention: str = "flex") -> Any:
    """torchtitan 0.3.0's ``Llama3Model.Config`` / ``Qwen3Model.Config`` of ``args``. ``attention``:
    one of torchtitan's language-model backends (``flex``, ``varlen``, ...), or ``sdpa``: torch's SDPA,
    causal over the whole sequence (trains on CPU, where FlexAttention has no backward)."""
    build = {"llama3": _llama3, "qwen3": _qwen3}[family(args.family).torchtitan_module]
    config = build(args, "flex" if attention == "sdpa" else attention)
    norms = [config.norm] + [n for layer in config.layers for n in (layer.attention_norm, layer.ffn_norm)]
    norms += [layer.attention.qk_norm for layer in config.layers if layer.attention.qk_norm is not None]
    for norm in norms:  # one eps for all, as nxd's rms_norm_eps (torchtitan's builders fix their own)
        norm.eps = args.norm_eps
    if attention == "sdpa":
        for layer in config.layers:
            layer.attention.inner_attention = ScaledDotProductAttention.Config()
    return config


def model_spec(args: TitanArgs, attention: str = "flex") -> ModelSpec:
    """torchtitan's ``ModelSpec`` of ``args``: its family's parallelize/pipeline functions and
    state-dict adapter, the model from :func:`model_config`."""
    import importlib

    module = importlib.import_module(f"torchtitan.models.{family(args.family).torchtitan_module}")
    spec = module.model_registry("debugmodel")
    return dataclasses.replace(spec, flavor="nxd", model=model_config(args, attention))


def read_args(folder: str) -> TitanArgs:
    """The args ``nxd ckpt convert --to torchtitan`` wrote into ``folder``."""
    path = os.path.join(folder, ARGS_FILE)
    with open(path) as f:
        return TitanArgs.from_dict(json.load(f), path)


def nxd_checkpoint() -> Any:
    """torchtitan's ``Trainer.Config`` for the folder ``$NXD_TORCHTITAN_CHECKPOINT``: its family's
    debug config (optimizer, schedule, loss) with the converted model, loading that folder's weights
    (model only) at step 0. Override the rest on torchtitan's command line."""
    import importlib

    folder = os.environ.get(CHECKPOINT_ENV)
    if not folder:
        raise ValueError(f"set {CHECKPOINT_ENV} to the folder nxd ckpt convert --to torchtitan wrote")
    args = read_args(folder)
    module = family(args.family).torchtitan_module
    registry = importlib.import_module(f"torchtitan.models.{module}.config_registry")
    config = getattr(registry, f"{module}_debugmodel")()
    config.model_spec = model_spec(args)
    config.loss.loss_fn.global_vocab_size = args.vocab_size
    config.checkpoint.enable = True
    config.checkpoint.initial_load_path = os.path.abspath(folder)
    config.checkpoint.initial_load_model_only = True
    return config
