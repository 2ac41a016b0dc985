"""What parallel layout a transformers model can run in, decided from its config alone.

One function answers both before launch (nxd-training's plan calls it through
``spec.extras["check_layout"]``) and on each rank (the build calls it again), so a layout is never
validated and then refused on a rank."""

from __future__ import annotations

import inspect
from typing import Any

from nxd.errors import ConfigError
from nxd_tensor_parallel.layout_rules import SizeNames, head_layout
from nxd_tensor_parallel.modules.kv_heads import local_kv_index
from nxd_tensor_parallel.tensor_plan import HF_STYLES as NXD_STYLES_OF_HF


def hf_tp_plan(config: Any, hf_class: type) -> dict[str, str]:
    """transformers' TP plan of the model ``config`` builds with ``hf_class``: the base model's
    ``base_model_tp_plan`` (under its prefix) and the class's own ``_tp_plan`` (the LM head)."""
    prefix = getattr(hf_class, "base_model_prefix", "model") or "model"
    plan = {f"{prefix}.{k}": v for k, v in (getattr(config, "base_model_tp_plan", None) or {}).items()}
    if plan:  # the head alone (every class lists it) does not make a plan
        plan.update(getattr(hf_class, "_tp_plan", None) or {})
    return plan


def check_layout(config: Any, hf_class: type, *, tp: int = 1, pp: int = 1, cp: int = 1,
                 sequence_parallel: bool = False) -> None:
    """Refuse, naming the key and the reason, a layout the transformers path cannot honour."""
    name = f"{hf_class.__name__} (model_type {config.model_type!r})"
    if pp > 1:
        check_pipeline(config, hf_class, name, pp)
    if cp > 1:
        raise ConfigError(f"distributed_strategy.context_parallel_size={cp}: {name} computes attention inside "
                          "transformers' attention modules, which hold no attention_core for ring attention to "
                          "replace; use context_parallel_size=1")
    if tp == 1:
        return
    if sequence_parallel:
        raise ConfigError(f"distributed_strategy.sequence_parallel: {name}'s norms and residuals run on whole "
                          "sequences (transformers' TP plan shards no sequence); set sequence_parallel: false")
    plan = hf_tp_plan(config, hf_class)
    if not plan:
        raise ConfigError(f"distributed_strategy.tensor_model_parallel_size={tp}: {name} has no tensor-parallel plan "
                          "(its config's base_model_tp_plan is empty), so nxd does not know which projections to "
                          "shard; use tensor_model_parallel_size: 1 with FSDP/ZeRO-1/DDP")
    unknown = {pattern: style for pattern, style in plan.items() if style not in NXD_STYLES_OF_HF}
    if unknown:
        listed = ", ".join(f"{p}: {s!r}" for p, s in sorted(unknown.items()))
        raise ConfigError(f"distributed_strategy.tensor_model_parallel_size={tp}: {name}'s TP plan has styles nxd does "
                          f"not implement ({listed}; nxd: {', '.join(NXD_STYLES_OF_HF)}); use "
                          "tensor_model_parallel_size: 1 with FSDP/ZeRO-1/DDP")
    kv_size_multiplier(config, hf_class, tp)


#: decoder-layer arguments that differ from layer to layer (sliced by the loop's index, or the previous
#: layer's output): nxd-pipeline's split of transformers' forward computes one set of arguments per
#: kind of layer, so it cannot pass them -> what each one is
PER_LAYER_ARGUMENTS = {
    "per_layer_input": "an input the base model's loop slices per layer index (Gemma 3n, Gemma 4)",
    "shared_kv_states": "K/V states an earlier layer hands to later ones",
    "prev_topk_indices": "the previous layer's top-k indices",
    "prev_router_hidden_states": "the previous layer's router state",
    "layer_idx": "the layer's index, passed by the base model's loop",
    "original_hidden_states": "the embedding output, passed beside the hidden state (hybrid blocks)",
    "transformer_hidden_states": "a shared block's output, passed beside the hidden state (hybrid blocks)",
}


def decoder_layer_parameters(hf_class: type) -> dict[str, str]:
    """``forward`` parameter -> decoder-layer class name, for the classes in ``hf_class``'s
    ``_no_split_modules`` that its module defines (found without building the model)."""
    module = inspect.getmodule(hf_class)
    out: dict[str, str] = {}
    for layer_name in getattr(hf_class, "_no_split_modules", None) or ():
        layer_class = getattr(module, layer_name, None)
        if isinstance(layer_class, type):
            out.update(dict.fromkeys(inspect.signature(layer_class.forward).parameters, layer_name))
    return out


def check_pipeline(config: Any, hf_class: type, name: str, pp: int) -> None:
    """Refuse what nxd-pipeline's split of a transformers decoder LM (embeddings / layers / norm +
    head, each stage through the model's own forward: ``nxd_pipeline.hf_decoder``) cannot run."""
    key = f"distributed_strategy.pipeline_model_parallel_size={pp}"
    layers = getattr(config, "num_hidden_layers", None)
    if isinstance(layers, int) and layers < pp:
        raise ConfigError(f"{key}: {name} has num_hidden_layers={layers}; every pipeline stage needs a layer")
    if getattr(config, "output_router_logits", False):
        raise ConfigError(f"{key}: {name} adds a router load-balancing loss over all its layers "
                          "(config.output_router_logits=True); each pipeline stage sees only its own layers' router "
                          "logits. Set output_router_logits: false in config.json, or use pipeline_model_parallel_size=1")
    for argument, layer_name in decoder_layer_parameters(hf_class).items():
        if argument in PER_LAYER_ARGUMENTS:
            raise ConfigError(f"{key}: {name}'s decoder layer {layer_name} takes {argument!r} "
                              f"({PER_LAYER_ARGUMENTS[argument]}); the pipeline split computes one set of layer "
                              "arguments per kind of layer and cannot pass it. Use tensor/data parallelism")


#: the module names of transformers' separate K and V projections (every family with a Llama-shaped
#: attention); K/V heads are replicated only where the TP plan shards these column-wise
KV_PROJECTIONS = ("k_proj", "v_proj")
#: a fused Q/K/V projection's name (Phi-3)
FUSED_QKV_PROJECTION = "qkv_proj"


def kv_size_multiplier(config: Any, hf_class: type, tp: int) -> int:
    """How many TP ranks hold each K/V head (nxd's ``kv_size_multiplier``, by the rule nxd's families
    use: ``layout_rules.head_layout``): 1 when TP divides the K/V heads, or when the plan gathers the
    K/V projections whole (``colwise_gather_output``: every rank attends over all heads); else the K/V
    projections (``colwise`` ``k_proj``/``v_proj`` in the plan) hold their piece on m neighbouring ranks.
    Refused, naming why, where heads cannot be placed that way."""
    name = f"{hf_class.__name__} (model_type {config.model_type!r})"
    key = f"distributed_strategy.tensor_model_parallel_size={tp}"
    heads, kv = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    if not isinstance(heads, int):
        return 1
    kv = kv if isinstance(kv, int) else heads
    m = head_layout(heads, kv, tp, replicate_kv=True, names=SizeNames(
        tp="distributed_strategy.tensor_model_parallel_size", heads=f"{name}'s num_attention_heads",
        kv_heads=f"{name}'s num_key_value_heads")).kv_size_multiplier
    if m == 1:
        return 1
    if any(local_kv_index(heads, kv, tp, r, m) is not None for r in range(tp)):
        raise ConfigError(f"{key}: {name}'s num_key_value_heads={kv} cannot be replicated over TP so that each rank's "
                          f"{heads // tp} query heads use its K/V heads in transformers' order (repeat_kv); use a TP "
                          "size dividing the K/V heads, or one the K/V heads divide")
    styles = {pattern.rsplit(".", 1)[-1]: style for pattern, style in hf_tp_plan(config, hf_class).items()}
    kv_styles = {styles[p] for p in (*KV_PROJECTIONS, FUSED_QKV_PROJECTION) if p in styles}
    if kv_styles == {"colwise_gather_output"}:
        return 1  # K/V gathered whole on every rank (OLMo 2, Phi-3): attention runs on all heads, nothing to place
    if any(styles.get(p) != "colwise" for p in KV_PROJECTIONS):
        raise ConfigError(f"{key} exceeds {name}'s num_key_value_heads={kv}: K/V heads are replicated over TP only "
                          f"where the model's TP plan shards separate {' and '.join(KV_PROJECTIONS)} 'colwise'; its "
                          f"plan has {', '.join(f'{p}: {styles.get(p)!r}' for p in KV_PROJECTIONS)}. Use a TP size "
                          "dividing the K/V heads")
    return m
