"""Model transforms: the one place parallelism and every other model rewrite is applied.

A model is built (by its family, or by the user's ``model_fn``), then an ordered list of registered
transforms runs over it. Each transform is a plugin component (``nxd_register_model_transforms``,
kind ``model_transform``) with

* ``name``: its registered name (``"lora"``, ``"pipeline"``, ``"zero1"``, ...);
* ``order``: where it runs; the anchors below leave room between them, and a third-party
  transform picks any number (ties run by name);
* ``applies``: whether the resolved config asks for it, as data: a :class:`When` (a config
  attribute and the test of its value) that the runner evaluates itself, or, for a condition no
  attribute test states, a callable ``(context, config) -> bool``;
* ``apply(model, context, config) -> nn.Module | None``: the rewritten model (``None``: changed in place);
* data-parallel strategies only (order :data:`DATA_PARALLEL`): ``make_optimizer(config,
  optimizer_class, parameters, *, context, **defaults) -> torch.optim.Optimizer``, the optimizer
  side of the same strategy (gradient sync, sharding, clipping);
* optional ``materialises_meta(context, config) -> bool``: True when the transform, run over a model
  whose parameters are still on the meta device (``model_init_config.meta_device_init``), shards it
  and then materialises and initialises only what this rank holds (nxd-fsdp). The build then leaves
  such a model on the meta device for it instead of materialising every parameter whole.

``context`` is the :class:`nxd.parallel.ParallelContext` the model is for (``None`` without
``torch.distributed``); ``config`` is the resolved NxD config. The trainer and
``initialize_parallel_model`` run :func:`apply_model_transforms`; ``initialize_parallel_optimizer``
asks :func:`data_parallel_strategy` for the one strategy that applies. Nothing else in nxd branches
on a parallelism (torchtitan's ``parallelize_<model>`` + ``ModelConverter`` list, as plugins).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nxd.errors import ComponentNotFound, PluginError
from nxd.resolved import NxdConfig

#: Order anchors, in the order transforms run. Between two anchors a plugin may add its own.
PARALLEL_PLAN = 100       # tensor/sequence parallel plan, context parallel, expert parallel
LOW_PRECISION = 200       # FP8 and other low-precision recipes (after the layers are final)
ADAPTER = 300             # LoRA and other adapters (see the parallel layers, wrap them)
ACTIVATION_CHECKPOINTING = 400  # full, selective by module, op-level (sees adapted layers)
COMPILE = 500             # torch.compile per block (compiles a block with its recomputation)
PIPELINE = 600            # pipeline split over context.pp
DATA_PARALLEL = 700       # the data-parallel strategy (ddp, zero1, fsdp): exactly one applies

ORDERS: dict[str, int] = {
    "parallel_plan": PARALLEL_PLAN, "low_precision": LOW_PRECISION, "adapter": ADAPTER,
    "activation_checkpointing": ACTIVATION_CHECKPOINTING, "compile": COMPILE, "pipeline": PIPELINE,
    "data_parallel": DATA_PARALLEL,
}

KIND = "model_transform"


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
    order: int
    apply: Callable[[Any, Any, Any], Any]
    applies: When | Callable[[Any, Any], bool] = ALWAYS
    #: data-parallel strategies: ``(config, optimizer_class, parameters, *, context, **defaults)``
    make_optimizer: Callable[..., Any] | None = None
    description: str = ""
    #: ``(context, config) -> bool``: this transform materialises a meta-device model's parameters
    #: itself, after sharding them (see the module docstring)
    materialises_meta: Callable[[Any, Any], bool] | None = None


def check_transform(name: str, transform: Any) -> None:
    """Raise :class:`PluginError` unless ``transform`` has the attributes of the contract."""
    for attr in ("order", "applies", "apply"):
        if not hasattr(transform, attr):
            raise PluginError(f"model transform {name!r} has no {attr!r}: a transform has name, order, "
                              "applies (a When, or a callable (context, config) -> bool) and apply(model, context, config)")
    if not isinstance(transform.applies, When) and not callable(transform.applies):
        raise PluginError(f"model transform {name!r} has applies={transform.applies!r}: an nxd.transforms.When or a "
                          "callable (context, config) -> bool")
    if isinstance(transform.order, bool) or not isinstance(transform.order, (int, float)):
        raise PluginError(f"model transform {name!r} has order {transform.order!r}: a number (see nxd.transforms.ORDERS)")
    if getattr(transform, "name", name) != name:
        raise PluginError(f"model transform registered as {name!r} calls itself {transform.name!r}")


def _registered_in_order() -> list[Any]:
    """Every registered transform's component record, in the order they run (``order``, then name)."""
    from nxd.plugins import state

    return sorted(state().components.all(KIND), key=lambda r: (r.obj.order, r.name))


def model_transforms() -> list[Any]:
    """Every registered transform, in the order they run (``order``, then name)."""
    return [r.obj for r in _registered_in_order()]


def slot_of(order: float) -> str:
    """The anchor of :data:`ORDERS` an ``order`` sits at, or after by how much: 110 -> ``"parallel_plan+10"``."""
    below = [(at, name) for name, at in ORDERS.items() if at <= order]
    if not below:
        return f"before {min(ORDERS, key=ORDERS.__getitem__)}"
    at, name = max(below)
    return name if order == at else f"{name}+{order - at:g}"


def describe_applies(applies: Any) -> str:
    """``applies`` in words: ``always``, ``<key>``, ``<key> == v``, ``<key> > n``, ``v in <key>`` or
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


def recipe() -> list[dict[str, Any]]:
    """The registered transforms as the trainer applies them (those whose ``applies`` holds for the
    run): order, slot, name, distribution and when it applies. ``nxd plugins`` prints it."""
    return [{"order": r.obj.order, "slot": slot_of(r.obj.order), "name": r.name, "distribution": r.distribution,
             "applies": describe_applies(r.obj.applies)} for r in _registered_in_order()]


def applicable_transforms(context: Any, config: Any) -> list[Any]:
    """The transforms ``config`` asks for, in order (a :class:`When` is read here, a callable asked)."""
    typed = NxdConfig.of(config)  # a partial dict answers with the defaults
    return [t for t in model_transforms()
            if (t.applies.holds(typed) if isinstance(t.applies, When) else t.applies(context, config))]


def apply_model_transforms(model: Any, context: Any, config: Any, *, until: int | None = None) -> Any:
    """Run every applicable transform over ``model`` in order (those with ``order < until`` only,
    when given) and return the result."""
    for transform in applicable_transforms(context, config):
        if until is not None and transform.order >= until:
            break
        result = transform.apply(model, context, config)
        if result is not None:
            model = result
    return model


def parallelize_model(model: Any, context: Any = None, config: Any = None) -> Any:
    """``model`` (built plain, e.g. by a :class:`nxd.specs.ModelSpec`'s ``build``) with its parallel
    layout applied: the applicable transforms ordered before :data:`LOW_PRECISION` (the TP/SP plan,
    head padding, expert parallelism, in the trainer's order). ``context``: the current parallel
    context when left out; ``config``: the NxD config (a partial dict is read with its defaults, the
    parallel sizes it leaves out with ``context``'s: :meth:`nxd.resolved.NxdConfig.for_context`)."""
    from nxd.parallel import resolve_context

    context = resolve_context(context)
    return apply_model_transforms(model, context, NxdConfig.for_context(config, context), until=LOW_PRECISION)


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
