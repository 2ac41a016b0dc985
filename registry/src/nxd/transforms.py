"""Model transforms: the one place parallelism and every other model rewrite is applied.

A model is built (by its family, or by the user's ``model_fn``: ``nxd_build_model`` does the
meta-device init and the placement on the context's device), then the **recipe** runs over it: the
named slots of :data:`SLOTS`, in that order, each holding the registered transforms that declare it.
Each transform is a plugin component (``nxd_register_model_transforms``, kind ``model_transform``) with

* ``name``: its registered name (``"lora"``, ``"pipeline"``, ``"zero1"``, ...);
* ``slot``: where it runs: a slot name of :data:`SLOTS` (``"adapter"``), or just before or after
  one (:func:`before` / :func:`after`: ``"before:adapter"``, ``"after:adapter"``). Within one
  position transforms run by registered name. A slot that is not in :data:`SLOTS` is refused when
  the plugin registers it, naming the distribution;
* ``applies``: whether the resolved config asks for it, as data: a :class:`When` (a config
  attribute and the test of its value) that the runner evaluates itself, or, for a condition no
  attribute test states, a callable ``(context, config) -> bool``;
* ``apply(model, context, config) -> nn.Module | None``: the rewritten model (``None``: changed in
  place). ``apply`` (and a callable ``applies``) that names a ``spec`` parameter also receives the
  model's family, its :class:`nxd.specs.ModelSpec` (``None`` for a user's ``model_fn``), so a
  transform may decide per family;
* data-parallel strategies only (slot ``data_parallel``): ``make_optimizer(config,
  optimizer_class, parameters, *, context, **defaults) -> torch.optim.Optimizer``, the optimizer
  side of the same strategy (gradient sync, sharding, clipping);
* optional ``materialises_meta(context, config) -> bool``: True when the transform, run over a model
  whose parameters are still on the meta device (``model_init_config.meta_device_init``), shards it
  and then materialises and initialises only what this rank holds (nxd-fsdp). The build then leaves
  such a model on the meta device for it instead of materialising every parameter whole;
* optional ``after_optimizer_step(optimizer, context, config) -> Callable[[], None] | None``: called
  once by ``initialize_parallel_optimizer``; the callable it returns runs after every step of the
  optimizer (nxd-moe's expert-bias balancer).

A family may replace slots for its own model: ``ModelSpec.parallelize`` maps a slot name to a
function ``(model, context, config)`` run there instead of the slot's transforms (torchtitan's
``parallelize_fn``, per slot), or to ``None`` to skip the slot.

``context`` is the :class:`nxd.parallel.ParallelContext` the model is for (``None`` without
``torch.distributed``); ``config`` is the resolved NxD config. The trainer and
``initialize_parallel_model`` run :func:`apply_model_transforms`; ``initialize_parallel_optimizer``
asks :func:`data_parallel_strategy` for the one strategy that applies. :func:`recipe_for` is the
one decision of what runs: the runner follows it and ``nxd plugins`` / ``nxd train --validate``
print it. Nothing else in nxd branches on a parallelism.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nxd.errors import ComponentNotFound, PluginError
from nxd.run_config import RunConfig

#: The recipe: its slots in the order they run, each with what it is for.
SLOTS: dict[str, str] = {
    "parallel_plan": "tensor and sequence parallel layers from the model's ParallelPlan",
    "expert_parallel": "the plan's experts split over EP and each expert's MLP over TP",
    "context_parallel": "ring attention over CP in the attention modules the plan names",
    "pad_model": "attention heads padded to a multiple of the TP size (on the parallel layers)",
    "low_precision": "FP8 and other low-precision recipes (the layers are final)",
    "adapter": "LoRA and other adapters (they wrap the parallel layers)",
    "activation_checkpointing": "full, selective or op-level recomputation (sees adapted layers)",
    "compile": "torch.compile per block (a block with its recomputation)",
    "pipeline": "the pipeline split over PP",
    "data_parallel": "the data-parallel strategy (ddp, zero1, fsdp): exactly one applies",
}
#: the slots of the parallel layout: what :func:`parallelize_model` runs
LAYOUT_SLOTS = ("parallel_plan", "expert_parallel", "context_parallel", "pad_model")

KIND = "model_transform"
_BEFORE, _AFTER = "before:", "after:"


def before(slot: str) -> str:
    """The position just before ``slot``'s transforms: ``before("adapter") == "before:adapter"``."""
    return _BEFORE + slot


def after(slot: str) -> str:
    """The position just after ``slot``'s transforms: ``after("adapter") == "after:adapter"``."""
    return _AFTER + slot


def slot_name(slot: str) -> str:
    """The slot of :data:`SLOTS` a position names: ``"after:adapter"`` -> ``"adapter"``."""
    return slot.split(":", 1)[1] if slot.startswith((_BEFORE, _AFTER)) else slot


def slot_key(slot: str) -> tuple[int, int]:
    """Where ``slot`` sorts: (index in :data:`SLOTS`, -1 before / 0 at / 1 after its transforms).
    Raises ``KeyError`` for a position that names no slot of :data:`SLOTS`."""
    if not isinstance(slot, str) or slot_name(slot) not in SLOTS:
        raise KeyError(slot)
    return list(SLOTS).index(slot_name(slot)), -1 if slot.startswith(_BEFORE) else 1 if slot.startswith(_AFTER) else 0


_UNSET: Any = object()


@dataclass(frozen=True)
class When:
    """When a transform applies, as data the runner reads off the resolved config (no call into
    the plugin): ``When()`` always; ``When(key)`` when the config attribute ``key`` is set (neither
    None nor False); ``When(key, equals=v)`` when it is ``v``; ``When(key, above=n)`` when it is
    greater than ``n``; ``When(key, contains=name)`` when ``name`` is in it."""

    key: str | None = None
    equals: Any = _UNSET
    above: Any = _UNSET
    contains: Any = _UNSET

    def holds(self, config: Any) -> bool:
        if self.key is None:
            return True
        value = getattr(config, self.key)
        if self.equals is not _UNSET:
            return value == self.equals
        if self.above is not _UNSET:
            return value > self.above
        if self.contains is not _UNSET:
            return self.contains in value
        return value is not None and value is not False


#: ``applies`` of a transform that runs for every config
ALWAYS = When()


@dataclass(frozen=True)
class ModelTransform:
    """A ready-made transform (any object with the same attributes works too)."""

    name: str
    #: a slot of :data:`SLOTS`, or :func:`before` / :func:`after` one
    slot: str
    apply: Callable[..., Any]
    applies: When | Callable[..., bool] = ALWAYS
    #: data-parallel strategies: ``(config, optimizer_class, parameters, *, context, **defaults)``
    make_optimizer: Callable[..., Any] | None = None
    description: str = ""
    #: ``(context, config) -> bool``: this transform materialises a meta-device model's parameters
    #: itself, after sharding them (see the module docstring)
    materialises_meta: Callable[[Any, Any], bool] | None = None
    #: ``(optimizer, context, config) -> Callable[[], None] | None``: what runs after every optimizer step
    after_optimizer_step: Callable[[Any, Any, Any], Callable[[], None] | None] | None = None


def check_transform(name: str, transform: Any, distribution: str = "a plugin") -> None:
    """Raise :class:`PluginError`, naming ``distribution``, unless ``transform`` has the attributes
    of the contract and declares a slot of the recipe."""
    where = f"{distribution}'s model transform {name!r}"
    if not hasattr(transform, "slot") and hasattr(transform, "order"):
        raise PluginError(f"{where} declares order={transform.order!r}: integer orders are gone since plugin-API 4; "
                          f"declare slot= one of {', '.join(SLOTS)} (or nxd.transforms.before/after one; "
                          "docs/hooks.md, migrating to 4)")
    for attr in ("slot", "applies", "apply"):
        if not hasattr(transform, attr):
            raise PluginError(f"{where} has no {attr!r}: a transform has name, slot, applies (a When, or a callable "
                              "(context, config) -> bool) and apply(model, context, config)")
    if not isinstance(transform.applies, When) and not callable(transform.applies):
        raise PluginError(f"{where} has applies={transform.applies!r}: an nxd.transforms.When or a "
                          "callable (context, config) -> bool")
    try:
        slot_key(transform.slot)
    except KeyError:
        raise PluginError(f"{where} declares slot {transform.slot!r}, which is not a slot of the recipe: one of "
                          f"{', '.join(SLOTS)}, or 'before:'/'after:' one of them (nxd.transforms.before/after)") from None
    if getattr(transform, "name", name) != name:
        raise PluginError(f"model transform registered as {name!r} calls itself {transform.name!r}")


def _registered_in_order() -> list[Any]:
    """Every registered transform's component record, in the order they run (slot, then name)."""
    from nxd.plugins import state

    return sorted(state().components.all(KIND), key=lambda r: (slot_key(r.obj.slot), r.name))


def model_transforms() -> list[Any]:
    """Every registered transform, in the order they run (slot, then name)."""
    return [r.obj for r in _registered_in_order()]


def describe_applies(applies: Any) -> str:
    """``applies`` in words: ``always``, ``<key> set``, ``<key> == v``, ``<key> > n``, ``v in <key>`` or
    the callable's name (decided per run)."""
    if not isinstance(applies, When):
        return f"{getattr(applies, '__qualname__', type(applies).__name__)}(context, config)"
    if applies.key is None:
        return "always"
    if applies.equals is not _UNSET:
        return f"{applies.key} == {applies.equals!r}"
    if applies.above is not _UNSET:
        return f"{applies.key} > {applies.above!r}"
    if applies.contains is not _UNSET:
        return f"{applies.contains!r} in {applies.key}"
    return f"{applies.key} set"


def _call(fn: Callable[..., Any], *args: Any, spec: Any) -> Any:
    """``fn(*args)``, plus ``spec=spec`` when ``fn`` names a ``spec`` parameter."""
    try:
        named = "spec" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins and C callables without a signature
        named = False
    return fn(*args, spec=spec) if named else fn(*args)


@dataclass(frozen=True)
class Step:
    """One line of the recipe for a run: a transform (or a family's replacement of a slot), whether
    it runs and why."""

    slot: str
    name: str
    distribution: str
    runs: bool
    why: str
    apply: Callable[..., Any]

    def as_dict(self) -> dict[str, Any]:
        return {"slot": self.slot, "name": self.name, "distribution": self.distribution, "runs": self.runs,
                "why": self.why}


def recipe_for(context: Any, config: Any, spec: Any = None) -> list[Step]:
    """The recipe for one run, in order: every registered transform with whether it runs for
    ``config`` (its ``applies``) and why, and, where ``spec`` (the family's
    :class:`nxd.specs.ModelSpec`) replaces a slot with its ``parallelize``, that family's step
    instead of the slot's transforms. What :func:`apply_model_transforms` runs and what
    ``nxd train --validate`` prints."""
    typed = RunConfig.of(config)  # a partial dict answers with the defaults
    replaced = dict(getattr(spec, "parallelize", None) or {})
    family = getattr(spec, "name", "?")
    steps: list[Step] = []
    for record in _registered_in_order():
        transform, slot = record.obj, record.obj.slot
        condition = describe_applies(transform.applies)
        if slot in replaced:  # the slot itself; a transform before or after it still runs
            steps.append(Step(transform.slot, record.name, record.distribution, False,
                              f"replaced by {family}'s parallelize[{slot!r}]", transform.apply))
            continue
        applies = transform.applies
        holds = applies.holds(typed) if isinstance(applies, When) else bool(_call(applies, context, config, spec=spec))
        steps.append(Step(transform.slot, record.name, record.distribution, holds,
                          condition if holds else f"skipped: needs {condition}", transform.apply))
    for slot, fn in replaced.items():
        why = f"{family}'s parallelize[{slot!r}]" if fn is not None else f"skipped by {family}'s parallelize[{slot!r}] = None"
        steps.append(Step(slot, f"{family}.parallelize", "model spec", fn is not None, why, fn))
    return sorted(steps, key=lambda s: slot_key(s.slot))  # stable: a family's step after the slot's skipped ones


def recipe() -> list[dict[str, Any]]:
    """The registered transforms in the order the trainer applies them (each when its ``applies``
    holds): slot, name, distribution and the condition. ``nxd plugins`` prints it."""
    return [{"slot": r.obj.slot, "name": r.name, "distribution": r.distribution,
             "applies": describe_applies(r.obj.applies)} for r in _registered_in_order()]


def format_recipe(steps: list[Step]) -> list[str]:
    """``steps`` as printed lines: slot, transform, distribution, and what decided it."""
    return [f"    {'runs' if s.runs else '--':<5} {s.slot:<26} {s.name:<26} {s.distribution:<20} {s.why}" for s in steps]


def applicable_transforms(context: Any, config: Any, spec: Any = None) -> list[Any]:
    """The registered transforms ``config`` asks for, in order (a :class:`When` is read here, a
    callable asked); without a family's replacements (the optimizer side sees no model)."""
    runs = {s.name for s in recipe_for(context, config) if s.runs}
    return [t for t in model_transforms() if t.name in runs]


def apply_model_transforms(model: Any, context: Any, config: Any, *, spec: Any = None,
                           slots: tuple[str, ...] | None = None) -> Any:
    """Run the recipe over ``model`` (the steps of :func:`recipe_for` that run; in ``slots`` only,
    when given) and return the result. ``spec``: the model's family (left out: the one that built
    it, :func:`nxd.specs.spec_of`)."""
    from nxd.specs import spec_of

    spec = spec if spec is not None else spec_of(model)
    for step in recipe_for(context, config, spec):
        if not step.runs or (slots is not None and slot_name(step.slot) not in slots):
            continue
        result = _call(step.apply, model, context, config, spec=spec)
        if result is not None:
            model = result
    return model


def parallelize_model(model: Any, context: Any = None, config: Any = None) -> Any:
    """``model`` (built plain, e.g. by a :class:`nxd.specs.ModelSpec`'s ``build``) with its parallel
    layout applied: the applicable transforms of :data:`LAYOUT_SLOTS` (the TP/SP plan, expert
    parallelism, context parallelism, head padding, in the trainer's order). ``context``: the
    current parallel context when left out; ``config``: the NxD config (a partial dict is read with
    its defaults, the parallel sizes it leaves out with ``context``'s, sequence parallelism with the
    model's: :meth:`nxd.run_config.RunConfig.for_context`)."""
    from nxd.parallel import resolve_context

    context = resolve_context(context)
    run = RunConfig.for_context(config, context, model)  # what the config leaves out: the context's, the model's
    return apply_model_transforms(model, context, run, slots=LAYOUT_SLOTS)


def build_parallel_model(spec: Any, model_config: Any, nxd_config: Any = None, context: Any = None) -> Any:
    """The model of ``spec`` (a :class:`nxd.specs.ModelSpec`) for ``context`` (the current one when
    left out), built plain from ``model_config`` (a config object or dict) and parallelised by
    :func:`parallelize_model`: what the trainer's transform list makes of it before low precision,
    adapters, checkpointing, the pipeline cut and the data-parallel strategy. For callers that need
    the parallel model alone (checkpoint conversion, Hugging Face import in tests, benchmarks)."""
    from nxd.parallel import bind_context, resolve_context

    context = resolve_context(context)
    config = spec.config_from_dict(model_config) if isinstance(model_config, dict) else model_config
    model = bind_context(spec.build, context)(config, nxd_config)
    return parallelize_model(model, context, nxd_config)


def meta_materialiser(context: Any, config: Any) -> Any:
    """The applicable transform that materialises a meta-device model after sharding it, or None."""
    for transform in applicable_transforms(context, config):
        takes_meta = getattr(transform, "materialises_meta", None)
        if takes_meta is not None and takes_meta(context, config):
            return transform
    return None


def data_parallel_strategy(context: Any, config: Any) -> Any:
    """The one applicable transform with an optimizer side (``make_optimizer``)."""
    strategies = [t for t in applicable_transforms(context, config) if getattr(t, "make_optimizer", None)]
    if len(strategies) > 1:
        raise PluginError(f"two data-parallel strategies apply to one config: "
                          f"{', '.join(t.name for t in strategies)}; each must apply only when selected")
    if strategies:
        return strategies[0]
    from nxd.components import missing_message
    from nxd.lookup import list_components

    name = config.data_parallel_strategy
    installed = list_components(KIND)
    if name not in installed:
        raise ComponentNotFound(missing_message(KIND, name, installed, need=f"data_parallel_strategy={name!r}"))
    raise PluginError(f"the data-parallel strategy {name!r} is installed but does not apply to this config "
                      "(its applies is false for it, or it has no make_optimizer)")


def _get(name: str) -> Any:
    from nxd.lookup import get_component

    return get_component(KIND, name)
