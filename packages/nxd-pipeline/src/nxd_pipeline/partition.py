"""Cutting a model into pipeline stages without tracing.

A pipeline-able model declares its structure (see docs/pipeline.md):

* ``nxd_pipeline_layout()`` -> ``{"embed": [paths], "layers": path, "head": [paths]}``: dotted
  module paths of what runs before the transformer layers (first stage only), of the
  ``nn.ModuleList`` of transformer layers, and of what runs after them (last stage only);
* ``nxd_pipeline_embed(**batch) -> Tensor``, ``nxd_pipeline_head(hidden, **batch) -> loss`` and
  optionally ``nxd_pipeline_layer(layer, hidden, **batch) -> Tensor``.

Hugging Face decoder-only LMs (transformers' Llama, Mistral, Qwen2, ...) that do not declare it get
it from :mod:`nxd_pipeline.hf_decoder`.

The layers are split into ``pp_size * virtual_size`` contiguous stages. Every rank keeps the
original module tree, with the layers it does not own removed and the layer container replaced by
a :class:`LayerSlice` that keeps global indices, so parameter names (``model.layers.17.mlp...``)
are the same at every pipeline size and checkpoints need no renaming.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from nxd.errors import ConfigError
from nxd_pipeline.hf_decoder import HFDecoderPipeline, hf_decoder_base, threads_router_logits

LAYOUT_METHOD = "nxd_pipeline_layout"
REQUIRED_METHODS = (LAYOUT_METHOD, "nxd_pipeline_embed", "nxd_pipeline_head")


class LayerSlice(nn.Module):
    """The transformer layers one rank owns, registered under their global indices."""

    def __init__(self, layers: dict[int, nn.Module]) -> None:
        super().__init__()
        for index in sorted(layers):
            self.add_module(str(index), layers[index])

    def __getitem__(self, index: int) -> nn.Module:
        return self._modules[str(index)]

    def __iter__(self) -> Iterator[nn.Module]:
        return iter(self._modules.values())

    def __len__(self) -> int:
        return len(self._modules)

    def indices(self) -> list[int]:
        return [int(k) for k in self._modules]


def get_submodule(model: nn.Module, path: str) -> nn.Module:
    try:
        return model.get_submodule(path) if path else model
    except AttributeError:
        raise ConfigError(f"{type(model).__name__}.{LAYOUT_METHOD}() names module {path!r}, which does not exist") from None


def set_submodule(model: nn.Module, path: str, module: nn.Module | None) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = get_submodule(model, parent_path)
    parent._modules[name] = module  # None removes it from parameters/state_dict but keeps the slot


def pipeline_interface(model: nn.Module) -> Any:
    """What provides the ``nxd_pipeline_*`` methods: the model itself, or for a Hugging Face
    decoder-only LM without them, an :class:`HFDecoderPipeline` over it (one per model)."""
    missing = [m for m in REQUIRED_METHODS if not callable(getattr(model, m, None))]
    if not missing:
        return model
    adapter = model.__dict__.get("_nxd_pipeline_adapter")  # made before pruning removed the modules it checks
    if adapter is not None:
        return adapter
    base = hf_decoder_base(model)
    if base is None:
        raise ConfigError(
            f"pipeline_parallel_size > 1 needs a pipeline-able model, but {type(model).__name__} lacks "
            f"{', '.join(missing)} and is not shaped like a Hugging Face decoder-only LM (<base>.embed_tokens, "
            "<base>.layers, <base>.norm, lm_head); see docs/pipeline.md for the model contract"
        )
    if getattr(getattr(model, "config", None), "output_router_logits", False) and not threads_router_logits(model, base):
        # the model's loss would see only the last stage's router logits (none): not its loss
        # (NxD's MoE examples pass them from layer to layer, and so from stage to stage)
        raise ConfigError(
            f"{type(model).__name__} adds a router load-balancing loss over all its layers "
            "(config.output_router_logits=True), which the Hugging Face pipeline adapter cannot split over stages; "
            "set output_router_logits=False to train without it, or use a model that carries the router "
            "statistics between stages (nxd-models-mixtral's MixtralForCausalLM, model 'mixtral'; docs/moe.md) or "
            "whose decoder layers take the router logits so far as 'past_router_logits' (NxD's MoE examples)"
        )
    adapter = model.__dict__["_nxd_pipeline_adapter"] = HFDecoderPipeline(model, base)
    return adapter


def model_layout(model: nn.Module) -> dict[str, Any]:
    """The model's declared layout, checked: ``embed`` and ``head`` lists, ``layers`` path."""
    layout = getattr(pipeline_interface(model), LAYOUT_METHOD)()
    if not isinstance(layout, dict) or not isinstance(layout.get("layers"), str):
        raise ConfigError(f"{type(model).__name__}.{LAYOUT_METHOD}() must return a dict with a 'layers' module path")
    embed = list(layout.get("embed", ()))
    head = list(layout.get("head", ()))
    layers = get_submodule(model, layout["layers"])
    if not isinstance(layers, (nn.ModuleList, LayerSlice)):
        raise ConfigError(f"{layout['layers']!r} must be an nn.ModuleList of transformer layers, got {type(layers).__name__}")
    for path in embed + head:
        get_submodule(model, path)
    return {"embed": embed, "layers": layout["layers"], "head": head}


def _layer_index(cut: Any, layers_path: str, num_layers: int) -> int:
    if isinstance(cut, int) and not isinstance(cut, bool):
        index = cut
    else:
        match = re.fullmatch(r"(?:.*\.)?(\d+)", str(cut))
        prefix = str(cut).rsplit(".", 1)[0] if "." in str(cut) else ""
        if match is None or (prefix and not layers_path.endswith(prefix) and not prefix.endswith(layers_path)):
            raise ConfigError(
                f"pipeline_config.pipeline_cuts entry {cut!r} is not a transformer layer; use a layer index "
                f"or a name like '{layers_path}.3'"
            )
        index = int(match.group(1))
    if not 0 <= index < num_layers - 1:
        raise ConfigError(
            f"pipeline_config.pipeline_cuts entry {cut!r} is out of range: a cut goes after layer 0..{num_layers - 2}"
        )
    return index


def stage_bounds_from_cuts(cuts: Sequence[Any], num_stages: int, num_layers: int, layers_path: str) -> list[range]:
    """Stages from manual cut points. A cut names the last layer of a stage (NxD semantics)."""
    if len(cuts) != num_stages - 1:
        raise ConfigError(
            f"pipeline_config.pipeline_cuts has {len(cuts)} cut(s) but pipeline_parallel_size x "
            f"virtual_pipeline_size = {num_stages} stages needs {num_stages - 1}"
        )
    ends = [_layer_index(c, layers_path, num_layers) + 1 for c in cuts]
    if ends != sorted(set(ends)):
        raise ConfigError(f"pipeline_config.pipeline_cuts must name strictly increasing layers, got {list(cuts)}")
    starts = [0] + ends
    return [range(a, b) for a, b in zip(starts, ends + [num_layers])]


def stage_bounds_even(num_stages: int, num_layers: int) -> list[range]:
    """NxD's auto partition: equal layer counts, the remainder going to the last stages."""
    base, extra = divmod(num_layers, num_stages)
    sizes = [base + (1 if s >= num_stages - extra else 0) for s in range(num_stages)]
    return _ranges(sizes)


def stage_bounds_balanced(costs: Sequence[float], num_stages: int, first_extra: float = 0.0,
                          last_extra: float = 0.0) -> list[range]:
    """Contiguous split minimising the costliest stage (layer costs, plus the embedding on the
    first stage and the head on the last). Exact by dynamic programming; layers are few."""
    n = len(costs)
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[s][i]: minimal max cost splitting layers[:i] into s non-empty stages
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for s in range(1, num_stages + 1):
        for i in range(s, n - (num_stages - s) + 1):
            for j in range(s - 1, i):
                stage = prefix[i] - prefix[j] + (first_extra if s == 1 else 0.0) + (last_extra if s == num_stages else 0.0)
                value = max(best[s - 1][j], stage)
                if value < best[s][i]:
                    best[s][i], cut[s][i] = value, j
    ends, i = [], n
    for s in range(num_stages, 0, -1):
        ends.append(i)
        i = cut[s][i]
    ends.reverse()
    return [range(a, b) for a, b in zip([0] + ends[:-1], ends)]


def _ranges(sizes: Sequence[int]) -> list[range]:
    out, start = [], 0
    for size in sizes:
        out.append(range(start, start + size))
        start += size
    return out


def param_count(modules: Sequence[nn.Module]) -> int:
    seen: set[int] = set()
    total = 0
    for module in modules:
        for p in module.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel()
    return total


def plan_stages(model: nn.Module, num_stages: int, pipeline_cuts: Sequence[Any] | None = None,
                partition_method: str = "even") -> list[range]:
    """Which global layer indices each stage runs."""
    layout = model_layout(model)
    layers = get_submodule(model, layout["layers"])
    num_layers = len(layers)
    if num_layers < num_stages:
        raise ConfigError(
            f"the model has {num_layers} transformer layers, fewer than the {num_stages} pipeline stages "
            "(pipeline_parallel_size x virtual_pipeline_size)"
        )
    if pipeline_cuts:
        return stage_bounds_from_cuts(list(pipeline_cuts), num_stages, num_layers, layout["layers"])
    if partition_method == "even":
        return stage_bounds_even(num_stages, num_layers)
    if partition_method == "params":
        costs = [float(param_count([layer])) for layer in layers]
        head = float(param_count([get_submodule(model, p) for p in layout["head"]]))
        return stage_bounds_balanced(costs, num_stages, last_extra=head)
    raise ConfigError(f"pipeline_config.partition_method must be 'even' or 'params', got {partition_method!r}")


def prune_to_stages(model: nn.Module, bounds: list[range], local_stages: Sequence[int]) -> None:
    """Keep only what ``local_stages`` run: their layers (global indices kept), the embedding
    on stage 0, the head on the last stage. Parameters tied across kept modules survive."""
    layout = model_layout(model)
    layers = get_submodule(model, layout["layers"])
    keep = {i for s in local_stages for i in bounds[s]}
    set_submodule(model, layout["layers"], LayerSlice({i: layers[i] for i in sorted(keep)}))
    last = len(bounds) - 1
    if 0 not in local_stages:
        for path in layout["embed"]:
            set_submodule(model, path, None)
    if last not in local_stages:
        for path in layout["head"]:
            set_submodule(model, path, None)


def tied_parameters(model: nn.Module) -> list[list[str]]:
    """Groups of parameter names bound to one tensor (e.g. tied input/output embeddings)."""
    by_id: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(name)
    return [names for names in by_id.values() if len(names) > 1]


def module_of(name: str, paths: Sequence[str]) -> str | None:
    for path in paths:
        if name == path or name.startswith(path + "."):
            return path
    return None


def is_float(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()
