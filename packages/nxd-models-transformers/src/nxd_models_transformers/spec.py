"""The ``transformers`` :class:`nxd.specs.ModelSpec`: any causal LM transformers builds, as its own class.

It claims every ``model_type`` no other installed family lists (``hf_model_types = ("*",)``), or any
when ``model.architecture: transformers``. The model is transformers' class (``AutoModelForCausalLM``'s
choice for the config) under :func:`~nxd_models_transformers.model.nxd_class`; tensor parallelism is
its own TP plan (``base_model_tp_plan``) applied by nxd's ``parallel_plan`` transform; data
parallelism (DDP, ZeRO-1, FSDP2), activation checkpointing and LoRA are the recipe's transforms."""

from __future__ import annotations

from typing import Any

import torch

from nxd.errors import ConfigError
from nxd.parallel import dim_size
from nxd.run_config import RunConfig
from nxd.specs import ModelSpec
from nxd_models_transformers.hf_io import load_hf_checkpoint, save_hf_checkpoint
from nxd_models_transformers.layout import KV_PROJECTIONS, check_layout, kv_size_multiplier
from nxd_models_transformers.model import decoder_layer_classes, nxd_class
from nxd_tensor_parallel.tensor_plan import PLAN_ATTRIBUTE, transformers_plan

NAME = "transformers"
_DTYPES = ("float32", "bfloat16", "float16")


def config_from_dict(data: Any) -> Any:
    """A transformers config from a ``config.json`` dict (its ``model_type`` picks the class); the
    parameter dtype is the dict's ``dtype``/``torch_dtype`` when it is a float type, else fp32."""
    from transformers import AutoConfig, PretrainedConfig

    if isinstance(data, PretrainedConfig):
        return data
    data = dict(data)
    model_type = data.pop("model_type", None)
    if not model_type:
        raise ConfigError("model_type is missing: the transformers family builds the class a config.json's "
                          "model_type names (give model.pretrained_checkpoint or model.model_config)")
    dtype = data.pop("dtype", None) or data.pop("torch_dtype", None)
    data.pop("torch_dtype", None)
    try:
        config = AutoConfig.for_model(model_type, **data)
    except ValueError as exc:
        raise ConfigError(f"model_type {model_type!r}: transformers cannot build it ({exc})") from None
    config.dtype = getattr(torch, dtype if dtype in _DTYPES else "float32")
    causal_lm_class(config)  # refused now when transformers has no causal LM for it
    return config


def param_dtype(config: Any) -> torch.dtype:
    """The parameter dtype :func:`config_from_dict` chose (transformers keeps it as a ``torch.dtype``)."""
    dtype = config.dtype
    return dtype if isinstance(dtype, torch.dtype) else getattr(torch, str(dtype).replace("torch.", ""))


def causal_lm_class(config: Any) -> type:
    """transformers' causal-LM class for ``config`` (``AutoModelForCausalLM``'s mapping)."""
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM._model_mapping[type(config)]
    except KeyError:
        raise ConfigError(f"model_type {config.model_type!r}: transformers has no causal-LM class for "
                          f"{type(config).__name__} (AutoModelForCausalLM does not list it)") from None


def layout_check(config: Any, *, tp: int = 1, pp: int = 1, cp: int = 1, sequence_parallel: bool = False) -> None:
    """``extras["check_layout"]``: nxd-training refuses before launch what the ranks' build would."""
    check_layout(config_from_dict(config), causal_lm_class(config_from_dict(config)), tp=tp, pp=pp, cp=cp,
                 sequence_parallel=sequence_parallel)


def build(config: Any, nxd_config: dict | None = None, context: Any = None) -> torch.nn.Module:
    """This rank's plain model: transformers' class for the config (its own initialisation), carrying
    its TP plan at TP > 1 for the ``parallel_plan`` transform."""
    config = config_from_dict(config)
    hf_class = causal_lm_class(config)
    tp, run = dim_size(context, "tp"), RunConfig.of(nxd_config)
    if run.model_init.meta_device_init:
        raise ConfigError(f"model.meta_device_init: {hf_class.__name__} is built with transformers' own initialisation "
                          "on every rank; materialising it from the meta device runs each module's reset_parameters, "
                          "not transformers' _init_weights, so a run from scratch would not start from the weights "
                          "it starts from without meta_device_init. Set meta_device_init: false")
    check_layout(config, hf_class, tp=tp, pp=dim_size(context, "pp"), cp=dim_size(context, "cp"),
                 sequence_parallel=run.sequence_parallel)
    cls = nxd_class(hf_class)
    model = cls._from_config(config, dtype=param_dtype(config))
    cls.nxd_transformer_layer_classes = decoder_layer_classes(model)
    if tp > 1:
        plan = transformers_plan(model)
        setattr(model, PLAN_ATTRIBUTE, plan)
        mark_kv_replication(model, plan, kv_size_multiplier(config, hf_class, tp))
    model.parallel_context = context
    return model


def mark_kv_replication(model: torch.nn.Module, plan: Any, m: int) -> None:
    """The plan's column-parallel K/V projections declare ``kv_size_multiplier`` m (the
    ``parallel_plan`` transform then holds each K/V piece on m ranks); their attention's
    ``num_key_value_groups`` is divided by m when the plan has been applied
    (:meth:`~nxd_models_transformers.model.NxdCausalLMMixin.nxd_parallelized`)."""
    if m == 1:
        return
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in KV_PROJECTIONS and plan.style_of(name) == "column":
            module.kv_size_multiplier = m


def flops_per_token(config: Any, seq_length: int | None = None) -> float:
    """``6 x`` the parameters of the matrices (every expert counted: an upper bound for MoE; the
    embedding lookup excluded), plus
    attention scores ``12 x layers x heads x head_dim x seq_length`` when ``seq_length`` is given."""
    config = config_from_dict(config) if isinstance(config, dict) else config
    with torch.device("meta"):
        model = causal_lm_class(config)._from_config(config)
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings()
    matmul = sum(p.numel() for p in model.parameters() if p.dim() >= 2 and p is not embed)
    if head is not None and head.weight is embed:
        matmul += embed.numel()  # tied: the head's matmul still happens
    flops = 6.0 * matmul
    if seq_length:
        hd = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        flops += 12.0 * config.num_hidden_layers * config.num_attention_heads * hd * seq_length
    return flops


SPEC = ModelSpec(
    name=NAME,
    config_from_dict=config_from_dict,
    build=build,
    transformer_layer_classes=(),  # per model: the built class's nxd_transformer_layer_classes
    hf_model_types=("*",),
    # the feature keys a config.json may set that transformers' class honours itself
    implements=frozenset({"model.sliding_window"}),
    lora_target_modules=("q_proj", "k_proj", "v_proj", "o_proj"),
    load_hf=load_hf_checkpoint,
    save_hf=save_hf_checkpoint,
    flops_per_token=flops_per_token,
    extras={"check_layout": layout_check, "sizes_from_hf_config": True},
)
