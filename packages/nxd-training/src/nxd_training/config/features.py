"""Which model a config describes, and whether the installed plugins can train exactly that model.

NxD Training picks its model class from ``model_source`` (``megatron``: the Megatron GPT model,
configured by keys such as ``activation`` and ``normalization``; ``hf``: Mixtral when the run name
says so, else Llama). nxd picks a registered :class:`nxd.specs.ModelSpec` the same way (or from
``model.architecture`` when given), then checks every key below: a key set to anything but its
Llama-style default is honoured only when the selected model lists it in ``spec.implements`` —
otherwise the run is refused before launch with the key and the plugin that provides it. So a
config never trains a different model than it names, and a new plugin (MoE, GPT, context
parallelism) makes the same config validate without a change here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import nxd
from nxd import ComponentNotFound, ConfigError
from nxd.catalog import provider_of
from nxd_training.config.schema import ModelConfig, TrainingConfig

#: NxD Training's model class for ``model_source: hf`` runs that name nothing else
DEFAULT_ARCHITECTURE = "llama"


@dataclass(frozen=True)
class Feature:
    key: str  # dotted config key
    what: str  # what a non-default value asks for, in words
    #: (value, the training sequence length) -> True when the value leaves a Llama-style model unchanged
    neutral: Callable[[Any, int | None], bool]
    provider: str | None = None  # the model (component name) that implements it, for the hint


def _is(*values: Any) -> Callable[[Any, int | None], bool]:
    return lambda value, _seq: value in values


def _window_covers_sequence(value: Any, seq: int | None) -> bool:
    # a window at least as long as the sequence masks nothing beyond the causal mask
    return value is None or (isinstance(value, int) and seq is not None and value >= seq)


#: Every NxDT key that changes the model beyond the common (HF Llama) keys.
FEATURE_KEYS: tuple[Feature, ...] = (
    Feature("model.moe", "a Mixture-of-Experts model", _is(None), "mixtral"),
    Feature("distributed_strategy.expert_model_parallel_size", "expert parallelism", _is(1), "mixtral"),
    Feature("model.normalization", "a different normalization", _is(None, "rmsnorm"), "gpt"),
    Feature("model.activation", "a different MLP activation", _is(None, "swiglu"), "gpt"),
    Feature("model.position_embedding_type", "a different position embedding", _is(None, "rope"), "gpt"),
    Feature("model.rotary_percentage", "partial rotary embeddings", _is(None, 1, 1.0), "gpt"),
    Feature("model.transformer_block_type", "a different transformer block layout", _is(None, "pre_ln"), "gpt"),
    Feature("model.has_bias", "biases in the linear layers", _is(None, False), "gpt"),
    Feature("model.use_scaled_init_method", "Megatron's scaled init of output layers", _is(None, False), "gpt"),
    Feature("model.make_vocab_size_divisible_by", "Megatron's vocabulary padding", _is(None, 1), "gpt"),
    Feature("model.hidden_dropout", "dropout on the hidden states", _is(None, 0, 0.0), "gpt"),
    Feature("model.attention_dropout", "dropout on the attention probabilities", _is(None, 0, 0.0), "gpt"),
    Feature("model.ffn_dropout", "dropout in the MLP", _is(None, 0, 0.0), "gpt"),
    Feature("model.sliding_window", "sliding-window attention", _window_covers_sequence, "mistral"),
    Feature("model.sliding_window_size", "sliding-window attention", _window_covers_sequence, "gpt"),
    Feature("distributed_strategy.context_parallel_size", "context parallelism (ring attention)", _is(1)),
    Feature("model.fusions.ring_attention", "ring attention (context parallelism)", _is(False, None)),
    Feature("model.fused_kernels", "fused GPU kernels (Liger-Kernel)", _is(None, [])),
)


#: Hugging Face config.json keys (``model.model_config``) that ask for a FEATURE_KEYS feature when
#: the YAML leaves its key null: Mistral-7B-v0.1's config.json sets ``sliding_window: 4096``
HF_FEATURE_KEYS: dict[str, str] = {"model.sliding_window": "sliding_window"}


def value_at(section: BaseModel, dotted: str) -> Any:
    """The value at ``dotted`` under ``section`` (a config or one of its sections), or None."""
    node: Any = section
    for part in dotted.split("."):
        if node is None:
            return None
        extra = getattr(node, "model_extra", None) or {}
        node = getattr(node, part, extra.get(part))
    if hasattr(node, "model_dump"):
        return node.model_dump()
    return node


def hf_config_file(model: ModelConfig) -> dict[str, Any] | None:
    """``model.model_config`` read as JSON (a path or inline dict), else the ``config.json`` of
    ``model.pretrained_checkpoint`` (the Hugging Face folder the run starts from); None when unset."""
    source, key = model.hf_config, "model.model_config"
    if source is None and model.pretrained_checkpoint:
        source, key = model.pretrained_checkpoint, "model.pretrained_checkpoint"
    if source is None or isinstance(source, dict):
        return source
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        hint = ("give a Hugging Face model folder (config.json + *.safetensors)" if key == "model.pretrained_checkpoint"
                else "point it at a Hugging Face config.json, or remove the key and give the model keys in the model section")
        raise ConfigError(f"{key}: file {str(path)!r} does not exist ({hint})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{key}: {str(path)!r} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{key}: {str(path)!r} must hold a JSON object, got {type(data).__name__}")
    return data


#: a spec's ``hf_model_types`` entry meaning "any model_type no other installed plugin lists"
ANY_MODEL_TYPE = "*"


def _model_types() -> dict[str, str]:
    """HF ``model_type`` -> registered model name (a plugin listing ``"*"`` under that key)."""
    out: dict[str, str] = {}
    for name in nxd.list_components("model"):
        spec = nxd.get_model(name)
        for model_type in getattr(spec, "hf_model_types", ()) or (name,):
            out.setdefault(model_type, name)
    return out


def builds_model_type(spec: Any, model_type: str) -> bool:
    """Whether ``spec`` builds HF ``model_type`` (it lists it, or lists ``"*"`` and no other plugin does)."""
    accepted = tuple(getattr(spec, "hf_model_types", ()) or (spec.name,))
    return model_type in accepted or (ANY_MODEL_TYPE in accepted and _model_types().get(model_type) in (None, spec.name))


def select_model(m: ModelConfig, model_source: str, run_name: str, hf: dict[str, Any] | None) -> tuple[str, str]:
    """(model name, why): ``model.architecture`` if given, else chosen the way NxDT chooses (from
    ``model_source``, ``model.moe``, the ``model_config`` file ``hf``, the run's ``name``)."""
    if m.architecture is not None:
        return m.architecture, f"model.architecture={m.architecture}"
    if m.moe is not None:
        return "mixtral", "model.moe (a Mixture-of-Experts model)"
    if model_source == "megatron":
        return "gpt", "model_source=megatron (NxD Training's Megatron GPT model)"
    model_type = (hf or {}).get("model_type")
    if model_type:
        types = _model_types()
        if model_type not in types and ANY_MODEL_TYPE in types:
            return types[ANY_MODEL_TYPE], (f"model.model_config (model_type {model_type!r}, which no nxd family lists: "
                                           f"the {types[ANY_MODEL_TYPE]!r} model builds it)")
        return types.get(model_type, model_type), f"model.model_config (model_type {model_type!r})"
    if "mixtral" in run_name.lower():
        return "mixtral", f"name={run_name!r} (NxD Training builds Mixtral for hf runs named *mixtral*)"
    return DEFAULT_ARCHITECTURE, "model_source=hf (NxD Training's HF Llama model)"


def model_spec(m: ModelConfig, model_source: str, run_name: str, hf: dict[str, Any] | None) -> tuple[Any, str]:
    """(the registered spec of the model this config describes, which key chose it), or a
    ConfigError naming the plugin."""
    name, why = select_model(m, model_source, run_name, hf)
    try:
        spec = nxd.get_component("model", name, need=why)
    except ComponentNotFound as exc:
        raise ConfigError(str(exc)) from None
    model_type = (hf or {}).get("model_type")
    accepted = tuple(getattr(spec, "hf_model_types", ()) or (spec.name,))
    if model_type and not builds_model_type(spec, model_type):
        other = _model_types().get(model_type)
        hint = f"set model.architecture: {other}" if other else _install_hint("model", model_type)
        raise ConfigError(f"model.model_config describes model_type {model_type!r}, but the {spec.name!r} model builds "
                          f"{', '.join(accepted)}; {hint}")
    return spec, why


def _install_hint(kind: str, name: str) -> str:
    provider = provider_of(kind, name)
    return f"pip install {provider}" if provider else f"install the plugin that provides the {kind} {name!r}"


def implemented_keys(spec: Any) -> set[str]:
    """The FEATURE_KEYS ``spec`` implements: ``spec.implements``, plus the CP keys when
    ``spec.context_parallel`` says its plan names attention that spans CP ranks."""
    implemented = set(getattr(spec, "implements", ()) or ())
    if getattr(spec, "context_parallel", False):
        implemented |= {"distributed_strategy.context_parallel_size", "model.fusions.ring_attention"}
    return implemented


def check_features(config: TrainingConfig, spec: Any, hf: dict[str, Any] | None, seq: int | None) -> dict[str, str]:
    """Refuse every feature key the selected model does not implement (one error, all keys);
    ``hf`` is the model_config file, whose HF_FEATURE_KEYS count as the YAML keys they stand for
    (the YAML key wins when set). Returns the config.json keys of features the model does not
    implement whose value leaves its model unchanged (a sliding window covering the ``seq``-token
    training sequence): hf key -> why. The model is given the config without them; the resolved
    notes say so."""
    implemented = implemented_keys(spec)
    problems, covered = [], {}
    for feature in FEATURE_KEYS:
        key, value, hf_key = feature.key, value_at(config, feature.key), HF_FEATURE_KEYS.get(feature.key)
        if value is None and hf_key and hf and hf.get(hf_key) is not None:
            key, value = f"model.model_config's {hf_key}", hf[hf_key]
        if feature.key in implemented:
            continue
        if feature.neutral(value, seq):
            if key != feature.key:
                covered[hf_key] = (f"{key}={value!r} covers the training sequence ({seq} tokens), so no position is "
                                   f"masked beyond the causal mask: the {spec.name!r} model (full causal attention) "
                                   "trains the same model; a longer sequence would need sliding-window attention")
            continue
        if feature.provider and feature.provider != spec.name:
            how = (f"model.architecture: {feature.provider}" if feature.provider in nxd.list_components("model")
                   else _install_hint("model", feature.provider))
            hint = f"the {feature.provider!r} model provides it ({how})"
        else:
            hint = "no installed model plugin implements it"
        problems.append(f"{key}={value!r}: {feature.what} is not implemented by the {spec.name!r} model; "
                        f"{hint}")
    if problems:
        raise ConfigError(problems[0] if len(problems) == 1 else
                          f"{len(problems)} model features not available:\n  " + "\n  ".join(problems))
    return covered


def recompute_table(spec: Any) -> dict[str, type]:
    """Every module class the model ``spec`` can recompute, by class name (how a written run config
    names them: a rank looks them up here, never imports a name from a file)."""
    classes = [cls for group in (getattr(spec, "recompute_modules", {}) or {}).values() for cls in group]
    classes += [*getattr(spec, "core_attention_classes", ()), *getattr(spec, "transformer_layer_classes", ())]
    return {cls.__name__: cls for cls in classes}


def recompute_classes(m: ModelConfig, spec: Any) -> list[type] | str | None:
    """NxD's ``activation_checkpoint_config`` from ``activations_checkpoint_granularity`` and
    ``activations_checkpoint_recompute`` (NxDT names mapped through ``spec.recompute_modules``)."""
    if m.activations_checkpoint_granularity is None:
        return None
    if m.activations_checkpoint_granularity in ("full", "op"):
        return m.activations_checkpoint_granularity
    table = dict(getattr(spec, "recompute_modules", {}) or {})
    for cls in (*getattr(spec, "core_attention_classes", ()), *getattr(spec, "transformer_layer_classes", ())):
        table.setdefault(cls.__name__, (cls,))
    from nxd_training.config.nxdt.history import recompute_names

    names = recompute_names(m, spec)  # NxDT 2.20's activations_checkpoint_recompute_mlp included
    if not names:
        classes = tuple(getattr(spec, "core_attention_classes", ()) or ())
        if not classes:
            raise ConfigError(f"model.activations_checkpoint_granularity=selective: the {spec.name!r} model names no "
                              "core-attention classes; list modules in model.activations_checkpoint_recompute")
        return list(classes)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise ConfigError(f"model.activations_checkpoint_recompute: the {spec.name!r} model cannot recompute "
                          f"{', '.join(map(repr, unknown))}; it can recompute: {', '.join(sorted(table))}")
    out: list[type] = []
    for name in names:
        out += [cls for cls in table[name] if cls not in out]
    return out
