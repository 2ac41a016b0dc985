"""Shapes of the components that several plugins exchange (duck-typed contracts).

A model plugin registers a :class:`ModelSpec`; a data plugin registers a :class:`DataModuleFactory`.
The trainer, pipeline, LoRA and checkpoint plugins rely only on what is written here, so a third
party's model or data plugin works with all of them. See docs/plugins/*.md for the long form.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

#: the sharding styles a :class:`ParallelPlan` names, in the words of NxD's layers
PLAN_STYLES = ("column", "row", "vocab", "gathered", "scattered", "partial_grad", "sequence", "experts")


def config_reader(from_dict: Callable[[Any], Any], preset: Callable[..., Any]) -> Callable[[Any], Any]:
    """A :class:`ModelSpec` ``config_from_dict``: ``{"preset": name, ...}`` starts from the family's
    preset ``name`` and overrides it; any other dict (or a config object) goes to ``from_dict``."""

    def config_from_dict(data: Any) -> Any:
        if isinstance(data, dict) and "preset" in data:
            data = preset(data["preset"], **{k: v for k, v in data.items() if k != "preset"})
        return from_dict(data)

    return config_from_dict


def model_builder(model_class: Callable[..., torch.nn.Module], read_config: Callable[[Any], Any]
                  ) -> Callable[..., torch.nn.Module]:
    """A :class:`ModelSpec` ``build``: ``model_class(config)``, plain (a dict config read with
    ``read_config``); the recipe's ``parallel_plan`` slot lays it out for the context and the run's
    sequence parallelism."""

    def build(config: Any, nxd_config: dict | None = None) -> torch.nn.Module:
        """The plain model (``nxd_config``: the run's, which a plain family does not need)."""
        return model_class(read_config(config) if isinstance(config, dict) else config)

    return build


@dataclass(frozen=True)
class ParallelPlan:
    """How a model family's modules are parallelised, as data (qualified-name patterns, ``fnmatch``
    style, against ``model.named_modules()`` of the built, unwrapped model).

    The plan is what a parallel-plan transform applies to a plain model, what ``nxd plan`` reads to
    size every rank, and what tests check the built model against (every parallel layer is named,
    every pattern names a module). One fact per module: a module matches one style at most.
    """

    #: output dimension sharded over ``tp`` (NxD's ``ColumnParallelLinear`` and its fused QKV form)
    column: tuple[str, ...] = ()
    #: input dimension sharded over ``tp`` (``RowParallelLinear``): its output is reduced (or
    #: reduce-scattered to the sequence under sequence parallelism)
    row: tuple[str, ...] = ()
    #: vocabulary sharded over ``tp`` (``ParallelEmbedding``)
    vocab: tuple[str, ...] = ()
    #: output dimension sharded over ``tp`` and gathered whole after the layer
    #: (``ColumnParallelLinear(gather_output=True)``: a plain model's LM head, whole logits on every rank)
    gathered: tuple[str, ...] = ()
    #: input dimension sharded over ``tp``, the whole input split on entry and the output summed
    #: (``RowParallelLinear(input_is_parallel=False)``: the partner of a ``gathered`` layer, as
    #: transformers' ``rowwise_split_input``)
    scattered: tuple[str, ...] = ()
    #: replicated modules fed TP-sharded activations (Qwen3's per-head q/k norms): each rank's
    #: weight gradient is partial and is summed over ``tp``
    partial_grad: tuple[str, ...] = ()
    #: run on sequence-sharded activations under sequence parallelism (norms); their weights'
    #: gradients are summed over ``tp``
    sequence: tuple[str, ...] = ()
    #: expert MLPs: experts split over ``ep``, each expert's MLP over ``tp``
    experts: tuple[str, ...] = ()
    #: the repeated blocks a pipeline may cut between (in model order)
    pipeline_blocks: tuple[str, ...] = ()
    #: context parallelism: attention modules whose ``attention_core`` (``(q, k, v, attention_mask)
    #: -> out``, :mod:`nxd_context_parallel.transform`) the ``context_parallel`` transform
    #: swaps for ring attention, exchanging K/V over ``cp``
    context_parallel: tuple[str, ...] = ()
    #: sharded modules whose sharded size is padded at its end to a multiple of the TP size when
    #: TP does not divide it (NxD's ``pad=True``: a vocabulary of any size at any TP); a module
    #: declaring ``pad_heads`` gets whole zero query groups when TP does not divide its query heads
    #: (NxD's ``pad_model``: GPT's attention projections)
    padded: tuple[str, ...] = ()
    #: column-parallel layers fed the whole sequence under sequence parallelism (the model gathers
    #: it before them, e.g. after replicated down projections): no sequence gather inside
    whole_sequence: tuple[str, ...] = ()
    #: the activations' sequence dimension that sequence parallelism splits (batch-first: 1)
    sequence_dimension: int = 1

    def style_of(self, name: str) -> str | None:
        """The style that names the module ``name`` (``"column"``, ...), or ``None``."""
        for style in PLAN_STYLES:
            if any(fnmatch.fnmatchcase(name, pattern) for pattern in getattr(self, style)):
                return style
        return None

    def modules(self, model: torch.nn.Module, style: str) -> list[tuple[str, torch.nn.Module]]:
        """``(name, module)`` of ``model`` that ``style``'s patterns name, in model order."""
        patterns = getattr(self, style)
        return [(n, m) for n, m in model.named_modules() if any(fnmatch.fnmatchcase(n, p) for p in patterns)]


@dataclass
class ModelSpec:
    """What a model plugin tells the rest of nxd about one model family.

    The model returned by ``build`` is an ``nn.Module`` for the parallel context it is given,
    written for one device (``nn.Linear``/``nn.Embedding`` or ``nxd_tensor_parallel.modules.plain``);
    the transform list parallelises it by its ``parallel_plan`` (a model built from nxd-tensor-parallel's
    parallel layers itself keeps working: the plan transform skips them). Its ``forward(input_ids,
    labels=None, position_ids=None, attention_mask=None, loss_mask=None)`` returns an object with
    ``.loss`` (mean over tokens whose ``loss_mask`` is 1, computed with vocab-parallel cross-entropy;
    ``None`` without labels) and ``.logits`` (vocab-sharded on TP ranks unless gathered)."""

    name: str
    #: config dict (nxd or Hugging Face ``config.json`` keys) -> model config object
    config_from_dict: Callable[[dict], Any]
    #: (model config, nxd_config or None, *, context) -> nn.Module for this rank. ``context`` is the
    #: :class:`nxd.parallel.ParallelContext` to build for (``None``: one process); callers pass it
    #: when the function names it (``nxd.parallel.bind_context``), so a build without it still works
    build: Callable[..., torch.nn.Module]
    #: classes of the repeated transformer blocks: full activation checkpointing and pipeline cuts
    transformer_layer_classes: tuple[type, ...]
    #: classes recomputed by selective activation checkpointing ("core attention")
    core_attention_classes: tuple[type, ...] = ()
    #: NxD Training recompute names (``model.activations_checkpoint_recompute: [CoreAttention]``)
    #: -> this model's module classes that the name selects; names not listed are refused before launch
    recompute_modules: dict[str, tuple[type, ...]] = field(default_factory=dict)
    #: Hugging Face ``config.json`` ``model_type`` values this plugin builds (empty: just ``name``);
    #: ``"*"``: any ``model_type`` no other installed plugin lists (nxd-models-transformers)
    hf_model_types: tuple[str, ...] = ()
    #: NxD Training config keys (dotted, e.g. ``"model.activation"``, ``"model.moe"``,
    #: ``"distributed_strategy.context_parallel_size"``) that change the model and that this plugin
    #: implements. A config giving any such key a non-default value is refused before launch unless
    #: the selected model lists it here (nxd-training's ``FEATURE_KEYS`` names every such key).
    implements: frozenset[str] = frozenset()
    #: default LoRA target module names (Hugging Face / PEFT names, e.g. "q_proj")
    lora_target_modules: tuple[str, ...] = ()
    #: (model, hf_dir) -> None: load a Hugging Face checkpoint directory into the built model
    load_hf: Callable[[torch.nn.Module, str], None] | None = None
    #: (model, out_dir) -> None: write config.json + safetensors loadable by transformers
    save_hf: Callable[[torch.nn.Module, str], None] | None = None
    #: (model config) -> training FLOPs per token (for MFU estimates)
    flops_per_token: Callable[[Any], float] | None = None
    #: (model, input_ids [batch, prompt], max_new_tokens, *, do_sample, temperature, top_k,
    #: eos_token_id, generator) -> ids [batch, prompt + new]; collective under TP. ``None``: the
    #: trainer writes no samples for this family.
    generate: Callable[..., torch.Tensor] | None = None
    #: named config presets (e.g. "llama3-8b") -> config dict
    presets: dict[str, dict] = field(default_factory=dict)
    #: anything else a plugin wants to publish (HF key mapping, ...)
    extras: dict[str, Any] = field(default_factory=dict)
    #: which modules are column/row/vocab/sequence parallel, which are experts, where the pipeline
    #: may cut: the family's parallel plan as data (``None``: not declared)
    parallel_plan: ParallelPlan | None = None

    #: the family's own parallelisation of named recipe slots (torchtitan's ``parallelize_fn``, per
    #: slot): slot name (:data:`nxd.transforms.SLOTS`) -> ``(model, context, config) -> nn.Module |
    #: None`` run there instead of the slot's registered transforms (it decides from ``config`` itself),
    #: or ``None`` to skip the slot. For a family no plan describes; ``data_parallel`` is not
    #: replaceable (its optimizer side sees no model). ``nxd train --validate`` prints the result.
    parallelize: Mapping[str, Callable[..., Any] | None] = field(default_factory=dict)

    #: the model runs under context parallelism (``context_parallel_size > 1``): its plan names the
    #: attention modules whose core the ``context_parallel`` transform swaps for ring attention over
    #: the CP ranks. Read from ``parallel_plan``, never given; models without it are refused under CP
    context_parallel: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        from nxd.transforms import SLOTS

        self.context_parallel = bool(self.parallel_plan is not None and self.parallel_plan.context_parallel)
        for slot in self.parallelize:
            if slot not in SLOTS or slot == "data_parallel":
                raise ValueError(f"model {self.name!r}: parallelize[{slot!r}] names no replaceable slot of the recipe: "
                                 f"one of {', '.join(s for s in SLOTS if s != 'data_parallel')}")
        self.build = _remembering_spec(self.build, self)


#: model -> the spec whose ``build`` made it (weak: a model's lifetime is its own; never pickled with it)
_BUILT_BY: weakref.WeakKeyDictionary[torch.nn.Module, ModelSpec] = weakref.WeakKeyDictionary()


def _remembering_spec(build: Callable[..., Any], spec: ModelSpec) -> Callable[..., Any]:
    """``build`` that records which spec made each model it returns (:func:`spec_of`); the signature
    stays ``build``'s (``nxd.parallel.bind_context`` reads it)."""

    @functools.wraps(build)
    def build_and_remember(*args: Any, **kwargs: Any) -> Any:
        model = build(*args, **kwargs)
        if isinstance(model, torch.nn.Module):
            _BUILT_BY[model] = spec
        return model

    return build_and_remember


def spec_of(model: Any) -> ModelSpec | None:
    """The :class:`ModelSpec` whose ``build`` made ``model`` (what the recipe's transforms receive as
    ``spec``), or ``None`` (a user's ``model_fn``)."""
    try:
        return _BUILT_BY.get(model)
    except TypeError:  # not weak-referenceable: not built by a spec
        return None


#: what :func:`family_spec` reads from the model class (never inherited from a ``base`` spec)
_CLASS_FIELDS = ("build", "transformer_layer_classes", "core_attention_classes", "parallel_plan")
#: a family's own identity (never inherited from a ``base`` spec either)
_OWN_FIELDS = ("name", "config_from_dict", "hf_model_types", "presets")


def family_spec(name: str, model_class: type[torch.nn.Module], config_from_dict: Callable[[Any], Any],
                base: ModelSpec | None = None, **fields: Any) -> ModelSpec:
    """The :class:`ModelSpec` of a model class that carries its family's facts as class attributes
    (nxd's families do): ``build`` (:func:`model_builder`), the block and core-attention classes
    (``nxd_transformer_layer_classes``, ``nxd_core_attention_classes``), the parallel plan
    (``nxd_parallel_plan``) and ``extras["model_class"]`` come from the class; ``fields`` give the rest.

    ``base``: the spec of the family whose model this one runs on (Qwen3 on Llama's, Qwen3-MoE and
    DeepSeek-V3 on Mixtral's): what ``fields`` leave out (HF import/export, generate, LoRA targets,
    implemented keys, extras) is ``base``'s; the class facts, name, config reader,
    HF model types and presets are never inherited."""
    skip = set(_CLASS_FIELDS) | set(_OWN_FIELDS)
    inherited = {} if base is None else {f.name: getattr(base, f.name) for f in dataclasses.fields(base)
                                         if f.init and f.name not in skip}
    extras = {**inherited.pop("extras", {}), "model_class": model_class, **fields.pop("extras", {})}
    return ModelSpec(name=name, config_from_dict=config_from_dict, build=model_builder(model_class, config_from_dict),
                     transformer_layer_classes=tuple(model_class.nxd_transformer_layer_classes),
                     core_attention_classes=tuple(getattr(model_class, "nxd_core_attention_classes", ())),
                     parallel_plan=getattr(model_class, "nxd_parallel_plan", None), extras=extras,
                     **{**inherited, **fields})


@runtime_checkable
class DataModule(Protocol):
    """Yields this data-parallel rank's micro-batches and remembers its position exactly."""

    def train_batches(self) -> Iterator[dict[str, torch.Tensor]]:
        """Endless micro-batches ``{"input_ids", "labels", optional "loss_mask", "position_ids",
        "attention_mask"}`` of shape ``[micro_batch_size, seq_length]``, continuing from the
        current position."""

    def valid_batches(self) -> Iterator[dict[str, torch.Tensor]]:
        """A finite pass over the validation split (same keys)."""

    def state_dict(self) -> dict[str, Any]:
        """The position (consumed samples, epoch, seed): part of every checkpoint."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where ``state`` was taken."""


class DataModuleFactory(Protocol):
    """Registered under a name (``indexed``, ``sft``, ...) via ``nxd_register_data_modules``.
    ``dp_rank``/``dp_size`` are the parallel context's data-parallel coordinates; a factory that
    names a ``context`` parameter also receives the whole :class:`nxd.parallel.ParallelContext`
    (``nxd.parallel.call_with_context``)."""

    def __call__(
        self,
        config: dict[str, Any],
        *,
        seq_length: int,
        micro_batch_size: int,
        global_batch_size: int,
        dp_rank: int,
        dp_size: int,
        seed: int,
    ) -> DataModule: ...


@runtime_checkable
class Workflow(Protocol):
    """A training objective other than next-token prediction (DPO, ORPO, ...), for one run.

    Attributes: ``data_module`` (the data module it trains on, e.g. ``"preference"``),
    ``data_options`` (keys it adds to the data section, e.g. ``max_prompt_length``) and
    ``supports_pipeline`` (whether it runs under pipeline parallelism).
    """

    def prepare(self, model: torch.nn.Module, data: DataModule, *, device: torch.device, dp_group: Any,
                resumed_step: int) -> None:
        """Once per run on every rank, after any resume and before the first step (e.g. computing
        reference log-probs). Collective: every rank calls it."""

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The micro-batch's differentiable loss and its metrics (detached scalars, means over the
        micro-batch, named as the user reads them, e.g. ``rewards/chosen``)."""


class WorkflowFactory(Protocol):
    """Registered under a name (``dpo``, ``orpo``) via ``nxd_register_workflows``; called with the
    options under ``model_alignment_strategy.<name>``. Raises :class:`nxd.errors.ConfigError`
    naming the key for options it cannot honour (called before launch to validate)."""

    def __call__(self, options: dict[str, Any]) -> Workflow: ...
