"""A torchtitan model's numbers (:class:`TitanArgs`) and nxd's model config, both ways.

``TitanArgs`` holds every field of torchtitan's Llama 3 / Qwen3 that changes the math, under the
names of torchtitan's ``ModelArgs`` (<= 0.2); :func:`args_from_model_config` reads them from a
torchtitan 0.3.0 ``Decoder.Config`` tree (``llama3.model_registry("8B").model``), and
:mod:`nxd_torchtitan.titan_config` builds that tree from them. A model either maps exactly or is
refused naming the field: nxd never substitutes a close-enough model.

============================================  ===========================================
nxd config (Hugging Face keys)                torchtitan
============================================  ===========================================
``hidden_size``                               ``dim``
``num_hidden_layers``                         ``n_layers``
``num_attention_heads`` / ``num_key_value_heads``  ``n_heads`` / ``n_kv_heads``
``head_dim``                                  ``head_dim`` (Llama 3: ``dim / n_heads`` only)
``intermediate_size``                         ``hidden_dim`` (<= 0.2: from ``multiple_of``, ``ffn_dim_multiplier``)
``vocab_size``                                ``vocab_size``
``rms_norm_eps``                              ``norm_eps`` (every RMSNorm's ``eps``)
``rope_theta``                                ``rope_theta``
``rope_scaling`` (``rope_type: llama3``)      ``rope_scaling`` (RoPE ``scaling="llama"``: factor, low/high freq factors, original max positions)
``max_position_embeddings``                   ``max_seq_len``
``tie_word_embeddings``                       ``enable_weight_tying``
============================================  ===========================================
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass
from typing import Any

from nxd_torchtitan.names import FAMILIES, family

#: the model's args, written by ``--to torchtitan`` beside the tensors it converted
ARGS_FILE = "nxd_torchtitan.json"
#: torchtitan's Llama 3.1 RoPE scaling fields (its ``RoPE.Config``) -> Hugging Face's ``rope_scaling`` keys
_SCALING_TO_HF = {"scaling_factor": "factor", "low_freq_factor": "low_freq_factor",
                  "high_freq_factor": "high_freq_factor",
                  "original_max_position_embeddings": "original_max_position_embeddings"}


@dataclass
class TitanArgs:
    """A dense torchtitan Llama 3 or Qwen3 model, every number that changes its output."""

    family: str
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_dim: int
    vocab_size: int
    norm_eps: float
    rope_theta: float
    max_seq_len: int
    #: torchtitan's ``scaling="llama"`` parameters (``_SCALING_TO_HF``'s keys), or None
    rope_scaling: dict[str, float] | None = None
    enable_weight_tying: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "torchtitan model args") -> TitanArgs:
        """Read a dict written by :meth:`to_dict`, or torchtitan <= 0.2's ``ModelArgs`` fields
        (``multiple_of``/``ffn_dim_multiplier`` instead of ``hidden_dim``, ``use_scaled_rope``)."""
        data = dict(data)
        if "family" not in data:
            raise ValueError(f"{where}: no 'family' ({' or '.join(FAMILIES)})")
        family(data["family"])
        n_heads = data.get("n_heads")
        data.setdefault("n_kv_heads", n_heads)
        if data["n_kv_heads"] is None:
            data["n_kv_heads"] = n_heads
        if data.get("head_dim") is None and n_heads and "dim" in data:
            data["head_dim"] = data["dim"] // n_heads
        if "hidden_dim" not in data and "dim" in data:
            data["hidden_dim"] = ffn_hidden_dim(data["dim"], data.pop("multiple_of", 256),
                                                data.pop("ffn_dim_multiplier", None))
        if data.pop("use_scaled_rope", False) and not data.get("rope_scaling"):
            data["rope_scaling"] = dict(_LLAMA31_SCALING, **data.pop("rope_scaling_args", {}))
        data.pop("rope_scaling_args", None)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known - _IGNORED_V02)
        if unknown:
            raise ValueError(f"{where}: fields {unknown} are not torchtitan Llama 3 / Qwen3 args nxd maps "
                             f"(known: {sorted(known)})")
        missing = sorted(f.name for f in dataclasses.fields(cls)
                         if f.default is dataclasses.MISSING and f.name not in data)
        if missing:
            raise ValueError(f"{where}: missing {missing}")
        return cls(**{k: v for k, v in data.items() if k in known})


#: torchtitan <= 0.2 ``ModelArgs`` fields that do not change the math (or are MoE-only and zero)
_IGNORED_V02 = {"depth_init", "use_flex_attn", "attn_mask_type", "eos_id", "attn_type", "qk_norm", "moe_enabled"}
#: torchtitan <= 0.2's default Llama 3.1 scaling (``use_scaled_rope=True``)
_LLAMA31_SCALING = {"scaling_factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192}


def ffn_hidden_dim(dim: int, multiple_of: int = 256, ffn_dim_multiplier: float | None = None) -> int:
    """torchtitan's SwiGLU width (``compute_ffn_hidden_dim``): 2/3 of 4 * dim, times the multiplier,
    rounded up to ``multiple_of``."""
    hidden = int(2 * 4 * dim / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def to_nxd_config(args: TitanArgs) -> dict[str, Any]:
    """nxd's model config (Hugging Face keys) of the torchtitan model ``args``."""
    fam = family(args.family)
    if fam.interleaved_rope and args.head_dim != args.dim // args.n_heads:
        raise ValueError(f"head_dim {args.head_dim} != dim / n_heads: torchtitan's Llama 3 has no head_dim")
    config = {
        "architectures": ["Qwen3ForCausalLM" if fam.qk_norm else "LlamaForCausalLM"],
        "model_type": "qwen3" if fam.qk_norm else "llama",
        "hidden_size": args.dim, "num_hidden_layers": args.n_layers, "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads, "head_dim": args.head_dim, "intermediate_size": args.hidden_dim,
        "vocab_size": args.vocab_size, "rms_norm_eps": args.norm_eps, "rope_theta": args.rope_theta,
        "max_position_embeddings": args.max_seq_len, "tie_word_embeddings": args.enable_weight_tying,
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
    }
    if args.rope_scaling:
        if not fam.interleaved_rope:
            raise ValueError(f"{args.family}: torchtitan's CosSinRoPE has no Llama scaling (rope_scaling)")
        config["rope_scaling"] = {"rope_type": "llama3",
                                  **{hf: args.rope_scaling[t] for t, hf in _SCALING_TO_HF.items()}}
    return config


def _refuse(family_name: str, key: str, value: Any, why: str) -> None:
    raise ValueError(f"{family_name} config {key}={value!r}: {why}; torchtitan's {family(family_name).torchtitan_module} "
                     "cannot express it, so the model has no torchtitan layout")


def from_nxd_config(family_name: str, config: dict[str, Any]) -> TitanArgs:
    """The torchtitan model of nxd's ``family_name`` model ``config`` (Hugging Face keys), or a
    ValueError naming the first field torchtitan cannot express."""
    import nxd

    fam = family(family_name)
    cfg = nxd.get_model(family_name).config_from_dict(config)
    for key in ("attention_bias", "mlp_bias"):
        if getattr(cfg, key, False):
            _refuse(family_name, key, True, "torchtitan's attention and MLP have no biases")
    if getattr(cfg, "hidden_act", "silu") != "silu":
        _refuse(family_name, "hidden_act", cfg.hidden_act, "torchtitan's FFN is SwiGLU")
    if bool(getattr(cfg, "qk_norm", False)) != fam.qk_norm:
        _refuse(family_name, "qk_norm", cfg.qk_norm, f"torchtitan's {fam.torchtitan_module} "
                f"{'always has' if fam.qk_norm else 'has no'} q/k norms")
    if fam.interleaved_rope and cfg.head_dim != cfg.hidden_size // cfg.num_attention_heads:
        _refuse(family_name, "head_dim", cfg.head_dim, "torchtitan's Llama 3 uses hidden_size / num_attention_heads")
    for key in ("sliding_window", "use_sliding_window"):
        if cfg.extra.get(key):
            _refuse(family_name, key, cfg.extra[key], "torchtitan attends causally over the whole sequence")
    scaling = None
    if cfg.rope_scaling:
        if cfg.rope_type != "llama3" or not fam.interleaved_rope:
            _refuse(family_name, "rope_scaling.rope_type", cfg.rope_type,
                    "torchtitan maps only Llama 3.1 scaling (llama3), on Llama 3")
        scaling = {t: cfg.rope_scaling[hf] for t, hf in _SCALING_TO_HF.items()}
    return TitanArgs(family=family_name, dim=cfg.hidden_size, n_layers=cfg.num_hidden_layers,
                     n_heads=cfg.num_attention_heads, n_kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
                     hidden_dim=cfg.intermediate_size, vocab_size=cfg.vocab_size, norm_eps=cfg.rms_norm_eps,
                     rope_theta=cfg.rope_theta, max_seq_len=cfg.max_position_embeddings, rope_scaling=scaling,
                     enable_weight_tying=bool(cfg.tie_word_embeddings))


def _one(values: set, what: str) -> Any:
    if len(values) != 1:
        raise ValueError(f"torchtitan model config: {what} differs between layers/norms ({sorted(values)}); nxd's "
                         "model has one value for it")
    return next(iter(values))


def args_from_model_config(model_config: Any) -> TitanArgs:
    """The :class:`TitanArgs` of a torchtitan 0.3.0 ``Llama3Model.Config`` / ``Qwen3Model.Config``
    (duck-typed: read by attribute, torchtitan need not be importable here). MoE layers, biases,
    per-layer differences and RoPE scalings other than ``none``/``llama`` are refused."""
    layers = list(model_config.layers)
    if not layers:
        raise ValueError("torchtitan model config has no layers")
    for i, layer in enumerate(layers):
        if getattr(layer, "feed_forward", None) is None or getattr(layer, "moe", None) is not None:
            raise ValueError(f"torchtitan model config: layer {i} is a MoE layer; nxd maps dense Llama 3 / Qwen3 only")
    attn = [layer.attention for layer in layers]
    rope = _one({type(a.rope).__qualname__ for a in attn}, "RoPE class")
    interleaved = rope.startswith("ComplexRoPE")
    has_qk_norm = _one({a.qk_norm is not None for a in attn}, "qk_norm")
    fam = "qwen3" if has_qk_norm else "llama"
    if interleaved == has_qk_norm:
        raise ValueError(f"torchtitan model config: {rope} with qk_norm={has_qk_norm} is neither torchtitan's Llama 3 "
                         "(ComplexRoPE, no q/k norms) nor its Qwen3 (CosSinRoPE, q/k norms)")
    n_heads = _one({a.n_heads for a in attn}, "n_heads")
    dim = model_config.dim
    norms = [model_config.norm] + [n for layer in layers for n in (layer.attention_norm, layer.ffn_norm)]
    norms += [a.qk_norm for a in attn if a.qk_norm is not None]
    ffn = [layer.feed_forward for layer in layers]
    biases = [lin for f in ffn for lin in (f.w1, f.w2, f.w3)] + [a.wo for a in attn]
    if any(getattr(lin, "bias", False) for lin in biases):
        raise ValueError("torchtitan model config: a linear layer has a bias; nxd maps bias-free Llama 3 / Qwen3")
    scaling_kind = _one({a.rope.scaling for a in attn}, "RoPE scaling")
    if scaling_kind not in ("none", "llama"):
        raise ValueError(f"torchtitan model config: RoPE scaling {scaling_kind!r} is not mapped (none, llama)")
    scaling = None
    if scaling_kind == "llama":
        scaling = {t: _one({getattr(a.rope, t) for a in attn}, t) for t in _SCALING_TO_HF}
    return TitanArgs(
        family=fam, dim=dim, n_layers=len(layers), n_heads=n_heads,
        n_kv_heads=_one({a.n_kv_heads if a.n_kv_heads is not None else a.n_heads for a in attn}, "n_kv_heads"),
        head_dim=_one({a.head_dim if a.head_dim is not None else dim // a.n_heads for a in attn}, "head_dim"),
        hidden_dim=_one({f.w1.out_features for f in ffn}, "FFN hidden_dim"), vocab_size=model_config.vocab_size,
        norm_eps=_one({n.eps for n in norms}, "RMSNorm eps"), rope_theta=_one({a.rope.theta for a in attn}, "theta"),
        max_seq_len=_one({a.rope.max_seq_len for a in attn}, "max_seq_len"), rope_scaling=scaling,
        enable_weight_tying=bool(getattr(model_config, "enable_weight_tying", False)))


def read_args_file(path: str) -> dict[str, Any]:
    """``--config`` for ``--from torchtitan``: a JSON file of :class:`TitanArgs` (what ``--to torchtitan``
    writes as ``nxd_torchtitan.json``; torchtitan <= 0.2 ``ModelArgs`` fields accepted), a Hugging Face
    ``config.json``, or ``MODULE:FLAVOR`` (``llama3:8B``, ``qwen3:0.6B``; needs torchtitan installed)."""
    import os

    if not os.path.exists(path) and ":" in path:
        return flavor_args(*path.split(":", 1)).to_dict()
    with open(path) as f:
        data = json.load(f)
    if isinstance(data, dict) and "family" in data:
        return TitanArgs.from_dict(data, path).to_dict()
    return data


def flavor_args(module: str, flavor: str) -> TitanArgs:
    """The args of torchtitan's own flavor ``flavor`` of ``torchtitan.models.<module>``."""
    import importlib

    if module not in {f.torchtitan_module for f in FAMILIES.values()}:
        raise ValueError(f"torchtitan module {module!r} is not mapped; mapped: llama3, qwen3")
    try:
        registry = importlib.import_module(f"torchtitan.models.{module}").model_registry
    except ModuleNotFoundError as exc:
        raise ValueError(f"{module}:{flavor} needs torchtitan installed ({exc})") from None
    try:
        spec = registry(flavor)
    except KeyError:
        raise ValueError(f"torchtitan's {module} has no flavor {flavor!r}") from None
    return args_from_model_config(spec.model)

