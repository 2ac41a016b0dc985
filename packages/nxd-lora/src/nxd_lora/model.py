"""``LoRAModel``: inject adapters into a model, freeze the base, merge and unmerge."""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from nxd.errors import ConfigError
from nxd.parallel import ParallelContext, resolve_context
from nxd_core_parallel.dtensor import copy_whole_, local
from nxd_core_parallel.wrapper import ForwardsToModule
from nxd_lora.config import LoraConfig
from nxd_lora.layers import LoraAdapter
from nxd_lora.naming import SUPPORTED_LAYERS, Plan, model_plan, model_spec_for, slots_for, tp_size_rank
from nxd_lora.quantize import check_nf4_target, quantize_nf4
from nxd_tensor_parallel.parallel_layers.layers import ColumnParallelLinear


def _matches(targets: list[str] | str, names: list[str]) -> bool:
    """PEFT's rule: a list entry matches a dotted name it equals or ends with (``.q_proj``); a
    string is a regex matched against the whole name. Any of ``names`` may match."""
    if isinstance(targets, str):
        return any(re.fullmatch(targets, n) for n in names)
    return any(n == t or n.endswith("." + t) for t in targets for n in names)


def _safe(name: str) -> str:
    return name.replace(".", "__")


class LoRAModel(ForwardsToModule, nn.Module):
    """Wrap ``module`` with LoRA adapters described by ``lora_config`` (NxD's ``LoRAModel``).

    Base parameters keep their names under ``module.`` and are frozen; adapters live in
    ``lora_layers`` and are the only trainable parameters (plus biases with ``bias="all"`` or
    ``"lora_only"``). The wrapper forwards calls and unknown attributes to ``module``.
    """

    def __init__(self, module: nn.Module, lora_config: LoraConfig, context: ParallelContext | None = None) -> None:
        """``context``: the parallel context ``module`` was built for (the current one when left
        out, as NxD's signature has no room for it)."""
        super().__init__()
        if not isinstance(lora_config, LoraConfig):
            raise ConfigError(f"lora_config must be an nxd_lora.LoraConfig, got {type(lora_config).__name__}")
        if isinstance(module, LoRAModel):
            raise ValueError("the model already has LoRA adapters")
        adapter_dir = None
        if lora_config.load_lora_from_ckpt:
            from nxd_lora.checkpoint import saved_config

            lora_config, adapter_dir = saved_config(lora_config)
        self.module = module
        self.parallel_context = resolve_context(context)
        self.lora_config = lora_config
        self.lora_layers = nn.ModuleDict()
        self._plan: Plan | None = model_plan(module)
        self._bases: dict[str, nn.Module] = {}
        self._originals: dict[str, torch.Tensor] = {}
        self._hooks: list[Any] = []
        #: the NF4 base weights (QLoRA), names under this wrapper: not in its state_dict (see quantize.py)
        self._nf4_keys: list[str] = []
        self._inject()
        if self._nf4_keys:
            self.register_state_dict_post_hook(_drop_nf4_state)
            self.register_load_state_dict_pre_hook(_note_load_prefix)
            self.register_load_state_dict_post_hook(_nf4_not_missing)
        self._freeze()
        if adapter_dir is not None:
            from nxd_lora.peft_format import load_adapter

            load_adapter(self, adapter_dir)
        if lora_config.lora_verbose:
            self.print_trainable_parameters()

    # ------------------------------------------------------------------ set-up
    def _targets(self) -> list[str] | str:
        targets = self.lora_config.target_modules
        if targets is None:
            spec = model_spec_for(self.module)
            targets = list(getattr(spec, "lora_target_modules", ()) or ())
            if not targets:
                raise ConfigError("LoraConfig.target_modules is None and the model spec has no default "
                                  "lora_target_modules; name the modules, e.g. ['q_proj', 'v_proj']")
            self.lora_config.target_modules = targets
        return targets

    def _inject(self) -> None:
        targets = self._targets()
        tp, rank = tp_size_rank(self.parallel_context)
        generator = shared_init_generator()
        to_quantize: list[tuple[str, nn.Module]] = []
        for name, sub in self.module.named_modules():
            if not name:
                continue
            if not isinstance(sub, SUPPORTED_LAYERS):
                if isinstance(targets, list) and _matches(targets, [name]) and not any(
                        isinstance(c, SUPPORTED_LAYERS) for c in sub.modules()):
                    raise ConfigError(
                        f"LoraConfig.target_modules matches {name} ({type(sub).__name__}), which LoRA cannot adapt; "
                        f"supported layers: {', '.join(c.__name__ for c in SUPPORTED_LAYERS)}"
                    )
                continue
            slots = slots_for(name, sub, self._plan, tp, rank)
            targeted = [_matches(targets, [name, s.hf_module]) for s in slots]
            if not any(targeted):
                continue
            if getattr(getattr(sub, "weight", None), "unpadded_size", None) is not None:
                raise ConfigError(f"LoraConfig.target_modules matches {name}, whose weight is padded to split over TP "
                                  "(pad=True, or attention heads padded by pad_model); LoRA on padded layers is not "
                                  "supported: leave it out of target_modules or use a TP size that divides it")
            if getattr(getattr(sub, "weight", None), "qkv_interleave", None) is not None:
                raise ConfigError(f"LoraConfig.target_modules matches {name}, Megatron's interleaved QKV with K/V heads "
                                  "replicated over TP (kv_size_multiplier); LoRA on it is not supported: leave it out "
                                  "of target_modules or use a tensor_parallel_size dividing num_query_groups")
            if isinstance(sub, ColumnParallelLinear) and getattr(sub, "kv_size_multiplier", 1) > 1:
                # its B gradient would need the sum over the ranks sharing the K/V piece, as the base's has
                raise ConfigError(f"LoraConfig.target_modules matches {name}, a K/V projection whose heads are "
                                  "replicated over TP (the model has fewer K/V heads than TP ranks); LoRA on it is not "
                                  "supported: leave it out of target_modules or use a tensor_parallel_size dividing "
                                  "num_key_value_heads")
            if self.lora_config.quantize_base == "nf4":
                check_nf4_target(name, sub, tp)  # every target checked before any is quantised
                to_quantize.append((name, sub))
            adapter = LoraAdapter(sub, slots, targeted, self.lora_config, generator)
            self.lora_layers[_safe(name)] = adapter
            self._bases[name] = sub
            self._hooks.append(sub.register_forward_hook(_make_hook(adapter), with_kwargs=True))
        if not len(self.lora_layers):
            raise ConfigError(f"LoraConfig.target_modules={targets!r} matched no adaptable layer of "
                              f"{type(self.module).__name__}")
        for name, sub in to_quantize:
            self._nf4_keys.append(f"module.{name}.{quantize_nf4(sub)}")

    def _freeze(self) -> None:
        mode = self.lora_config.bias
        lora_bases = set(self._bases)
        for name, param in self.module.named_parameters():
            owner, _, leaf = name.rpartition(".")
            is_bias = leaf.startswith("bias")
            param.requires_grad_(is_bias and (mode == "all" or (mode == "lora_only" and owner in lora_bases)))

    # ------------------------------------------------------------------ queries
    def get_base_model(self) -> nn.Module:
        return self.module

    def adapters(self) -> dict[str, tuple[nn.Module, LoraAdapter]]:
        """``{base layer name: (base layer, adapter)}``."""
        return {name: (base, self.lora_layers[_safe(name)]) for name, base in self._bases.items()}

    @property
    def plan(self) -> Plan | None:
        return self._plan

    def trainable_parameters(self) -> tuple[int, int]:
        """``(trainable, total)`` parameter counts on this rank."""
        params = list(self.parameters())
        return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)

    def print_trainable_parameters(self) -> str:
        trainable, total = self.trainable_parameters()
        line = f"trainable params: {trainable:,} || all params: {total:,} || trainable%: {100 * trainable / total:.4f}"
        if not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0:
            print(line)  # once per job, not once per rank (the counts are this rank's)
        return line

    # ------------------------------------------------------------------ forward
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    # ------------------------------------------------------------------ merge
    @torch.no_grad()
    def merge_lora(self) -> None:
        """Add every adapter's update into its base weight (the hooks then add nothing). The original
        weights are kept so :meth:`unmerge_lora` restores them bit for bit."""
        if self.lora_config.quantize_base is not None:
            raise ConfigError("merge_lora with LoraConfig.quantize_base: the base is stored as NF4 codes and cannot "
                              "hold the update; save the adapter and merge it into the original base")
        for name, (base, adapter) in self.adapters().items():
            if adapter.merged:
                continue
            for pname, new in adapter.merged_weights(base).items():
                weight = getattr(base, pname)
                self._originals[f"{name}.{pname}"] = local(weight).clone()  # under FSDP: this rank's rows
                copy_whole_(weight, new)
            adapter.merged = True

    @torch.no_grad()
    def unmerge_lora(self) -> None:
        """Undo :meth:`merge_lora` exactly (restores the stored base weights)."""
        for name, (base, adapter) in self.adapters().items():
            if not adapter.merged:
                continue
            for pname, _, _ in adapter.weight_params(base):
                local(getattr(base, pname)).copy_(self._originals.pop(f"{name}.{pname}"))
            adapter.merged = False

    def set_adapters_enabled(self, enabled: bool) -> None:
        """Switch the adapters off (base model outputs) or back on."""
        for adapter in self.lora_layers.values():
            adapter.disabled = not enabled


def shared_init_generator() -> torch.Generator:
    """A generator in the same state on every rank, seeded from global rank 0's default RNG (so
    ``torch.manual_seed`` still decides the adapter). Ranks' default RNGs need not agree: model
    building consumes them differently per TP/PP rank. Collective when torch.distributed is up."""
    seed = [int(torch.randint(0, 2**62, (1,), device="cpu").item())]  # CPU RNG also under a meta default device
    # torch's "fake" backend (shape-only dry runs such as ``nxd plan --dry-run``) moves no data: an
    # object broadcast would read an unset size on rank > 0. Each rank keeps its own seed there.
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1 and dist.get_backend() != "fake":
        dist.broadcast_object_list(seed, src=0)
    return torch.Generator().manual_seed(seed[0])


def _drop_nf4_state(model: LoRAModel, state_dict: dict, prefix: str, local_metadata: Any) -> None:
    # registered before any data-parallel wrapper's hooks: FSDP never gathers the NF4 shards
    for key in model._nf4_keys:
        state_dict.pop(prefix + key, None)


def _note_load_prefix(model: LoRAModel, state_dict: dict, prefix: str, *args: Any) -> None:
    model._load_prefix = prefix


def _nf4_not_missing(model: LoRAModel, incompatible: Any) -> None:
    prefix = model.__dict__.pop("_load_prefix", "")
    expected = {prefix + key for key in model._nf4_keys}
    incompatible.missing_keys[:] = [k for k in incompatible.missing_keys if k not in expected]


def _make_hook(adapter: LoraAdapter):
    def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        x = args[0] if args else next(iter(kwargs.values()))
        return adapter.apply(module, x, output)

    return hook


def get_lora_model(model: nn.Module, lora_config: LoraConfig) -> LoRAModel:
    """NxD's helper: ``LoRAModel(model, lora_config)``."""
    return LoRAModel(model, lora_config)
