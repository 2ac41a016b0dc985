"""``neuronx_distributed.modules.lora.model``: NxD's ``LoraModel`` on nxd-lora, and NxD's module constants.

nxd-lora's ``LoRAModel`` keeps the whole wrapper in its ``state_dict`` (``module.*`` base +
``lora_layers.*``: what nxd's checkpoints, FSDP and resharding use). NxD's ``LoraModel`` returns what
its ``LoraConfig`` asks to save instead, and that is what this class does (NxD's
``modules/lora/model.py``, Release 2.29):

* ``save_lora_base=False``: the adapter only (plus biases for ``bias="all"``/``"lora_only"``);
* ``save_lora_base=True, merge_lora=False``: the base (an adapted module's tensors under
  ``<module>.base_layer.``) and the adapter;
* ``save_lora_base=True, merge_lora=True``: the base with the adapter merged in, under the base
  model's own keys (the model itself is left unmerged);
* ``merge_sharded_lora=True`` (the default) saves the adapter only, gathered over TP, whatever
  ``save_lora_base``/``merge_lora`` say (NxD also rewrites the config to say so; nxd leaves it).

Adapter tensors carry PEFT's names without PEFT's ``base_model.model.`` prefix
(``<module>.lora_A.weight``, ``<module>.lora_embedding_A``): NxD's names for plain modules; for a model
registered with an nxd model spec, the Hugging Face module names (``q_proj`` of a fused ``qkv_proj``).
``load_state_dict`` takes any of these, and with no argument loads the adapter held in ``lora_ckpt``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import _IncompatibleKeys

import nxd_lora
from neuronx_distributed.utils.logger import get_logger
from nxd.parallel import ParallelContext
from nxd_lora.naming import tp_size_rank
from nxd_lora.peft_format import PREFIX, collect_adapter_state_dict, load_adapter_tensors

__all__ = ["CONFIG_NAME", "MODELS_TO_LORA_TARGET_MODULES_MAPPING", "WEIGHTS_NAME", "LoraModel"]

logger = get_logger()

#: what marks an adapter tensor's key (NxD's rule: ``"lora_" in key``)
ADAPTER_MARK = "lora_"
BASE_LAYER = ".base_layer."


class LoraModel(nxd_lora.LoRAModel):
    """nxd-lora's model under NxD's class name, with NxD's ``state_dict``/``load_state_dict`` (module
    docstring). ``lora_ckpt``: an adapter state dict ``load_state_dict()`` loads (NxD's attribute)."""

    def __init__(self, module: nn.Module, config: nxd_lora.LoraConfig, context: ParallelContext | None = None) -> None:
        super().__init__(module, config, context)
        # NxD's flags; with load_lora_from_ckpt nxd-lora has loaded the saved adapter already
        self.is_lora_enabled = True
        self.is_checkpoint_loaded = config.load_lora_from_ckpt
        self.is_base_model_loaded = False

    @property
    def is_lora_merged(self) -> bool:
        return bool(len(self.lora_layers)) and all(a.merged for a in self.lora_layers.values())

    def module_state_dict(self) -> dict[str, Any]:
        return self.module.state_dict()

    # ------------------------------------------------------------------ saving
    def _base_layer_names(self) -> dict[str, str]:
        """``{<adapted module>.: <adapted module>.base_layer.}``: NxD's (and PEFT's) names of an adapted
        module's own tensors."""
        return {f"{name}.": f"{name}{BASE_LAYER}" for name in self._bases}

    def _to_base_layer(self, key: str, names: dict[str, str]) -> str:
        for plain, wrapped in names.items():
            if key.startswith(plain):
                return wrapped + key[len(plain):]
        return key

    def _adapter_state(self) -> dict[str, torch.Tensor]:
        """The adapter (and trainable biases), gathered over TP, under NxD's keys."""
        return {k.removeprefix(PREFIX): v for k, v in collect_adapter_state_dict(self).items()}

    def _nxd_state_dict(self, keep_vars: bool) -> dict[str, Any]:
        config = self.lora_config
        save_base, merge = config.save_lora_base, config.merge_lora
        if config.merge_sharded_lora and (save_base or merge):
            logger.info("Since merged_sharded_lora is enabled, we will disable save_lora_base and merge_lora to save "
                        "merged LoRA adapter only.")
            save_base = merge = False
        if not config.merge_sharded_lora and tp_size_rank(self.parallel_context)[0] > 1:
            raise NotImplementedError(
                "LoraConfig.merge_sharded_lora=False under tensor parallelism: NxD's per-rank adapter shards are its "
                "own wrapper layers' layout, which nxd-lora does not have; set merge_sharded_lora=True (the adapter, "
                "gathered over TP) or save with nxd.save_checkpoint (every rank's shard, reshardable)")
        if save_base and merge:
            already = self.is_lora_merged
            self.merge_lora()
            try:
                return {k: v.detach().clone() for k, v in self.module.state_dict().items()}
            finally:
                if not already:
                    self.unmerge_lora()
        adapter = self._adapter_state()
        if not save_base:
            return adapter
        names = self._base_layer_names()
        base = {self._to_base_layer(k, names): v for k, v in self.module.state_dict(keep_vars=keep_vars).items()}
        return {**base, **adapter}

    def state_dict(self, *args: Any, destination: dict[str, Any] | None = None, prefix: str = "",
                   keep_vars: bool = False) -> dict[str, Any]:
        """What the ``LoraConfig`` asks to save (module docstring); collective under TP (every TP
        rank calls it). Inside a parent module's ``state_dict`` (``destination``/``prefix`` given) it
        is torch's, the whole wrapper: the parent's ``load_state_dict`` loads through torch's
        recursion, which only knows the wrapper's own tensors."""
        if args or destination is not None or prefix:
            return super().state_dict(*args, destination=destination, prefix=prefix, keep_vars=keep_vars)
        return self._nxd_state_dict(keep_vars)

    # ------------------------------------------------------------------ loading
    def _load_nxd_state(self, state_dict: Mapping[str, Any], strict: bool) -> _IncompatibleKeys:
        """Base tensors into the base model, adapter tensors into the adapters (keys as ``state_dict``
        returns them, or the base model's own names)."""
        plain = {wrapped: name for name, wrapped in self._base_layer_names().items()}
        base: dict[str, Any] = {}
        adapter: dict[str, torch.Tensor] = {}
        for key, value in state_dict.items():
            if ADAPTER_MARK in key:
                adapter[PREFIX + key] = value
                continue
            for wrapped, name in plain.items():
                if key.startswith(wrapped):
                    key = name + key[len(wrapped):]
                    break
            base[key] = value
        result = self.module.load_state_dict(base, strict=False)
        used, missing = load_adapter_tensors(self, adapter, "LoraModel.load_state_dict")
        keys = _IncompatibleKeys(
            list(result.missing_keys) + [k.removeprefix(PREFIX) for k in missing],
            list(result.unexpected_keys) + sorted(k.removeprefix(PREFIX) for k in set(adapter) - used),
        )
        if strict and (keys.missing_keys or keys.unexpected_keys):
            raise RuntimeError(f"Error(s) in loading state_dict for LoraModel: missing keys {keys.missing_keys}, "
                               f"unexpected keys {keys.unexpected_keys}")
        return keys

    def load_lora_adapter(self) -> _IncompatibleKeys:
        """Load ``lora_ckpt`` (NxD's step 2 of ``load_state_dict``). Without one, the adapter that
        ``load_lora_from_ckpt`` read at construction is already in place: nothing is missing."""
        if not self.is_base_model_loaded and not self.lora_config.save_lora_base:
            raise RuntimeError("LoraModel.load_lora_adapter: load the base model first (load_state_dict(base "
                               "state dict)), or save with LoraConfig.save_lora_base=True")
        ckpt = self.__dict__.get("lora_ckpt")
        result = _IncompatibleKeys([], []) if ckpt is None else self._load_nxd_state(ckpt, strict=False)
        if self.lora_config.lora_verbose:
            self.print_trainable_parameters()
        return result

    def load_state_dict(self, state_dict: Mapping[str, Any] | None = None, strict: bool = False,
                        assign: bool = False) -> _IncompatibleKeys | None:
        """NxD's two steps: ``state_dict`` into the base (and adapters, for keys that name them), then,
        with ``load_lora_from_ckpt``, the adapter in ``lora_ckpt``. ``strict``: fail on keys that match
        nothing or tensors left unloaded (NxD's default: False). Returns ``None`` when nothing loads."""
        if assign:
            raise NotImplementedError("LoraModel.load_state_dict(assign=True) is not supported: the base model's "
                                      "and the adapters' tensors are copied into place")
        config = self.lora_config
        result = None
        if state_dict is not None and (not config.save_lora_base or not self.is_checkpoint_loaded):
            result = self._load_nxd_state(state_dict, strict)
            self.is_base_model_loaded = True
        if config.load_lora_from_ckpt:
            lora = self.load_lora_adapter()
            if result is None:
                result = lora
            else:  # missing: what neither step loaded
                result = _IncompatibleKeys([k for k in result.missing_keys if k in set(lora.missing_keys)],
                                           result.unexpected_keys + lora.unexpected_keys)
        if result is not None and result.missing_keys and config.load_lora_from_ckpt:
            raise RuntimeError(f"Missing keys when loading state dictionary: {', '.join(result.missing_keys)}")
        return result


#: NxD's file names of a single-device adapter save (nxd-lora writes PEFT's: adapter_model.safetensors)
WEIGHTS_NAME = "adapter_model.pt"
CONFIG_NAME = "adapter_config.json"
#: NxD's (PEFT's) default LoRA targets per Hugging Face model type
MODELS_TO_LORA_TARGET_MODULES_MAPPING = {
    "t5": ["q", "v"], "mt5": ["q", "v"], "bart": ["q_proj", "v_proj"], "gpt2": ["c_attn"],
    "bloom": ["query_key_value"], "blip-2": ["q", "v", "q_proj", "v_proj"], "opt": ["q_proj", "v_proj"],
    "gptj": ["q_proj", "v_proj"], "gpt_neox": ["query_key_value"], "gpt_neo": ["q_proj", "v_proj"],
    "bert": ["query", "value"], "roberta": ["query", "value"], "xlm-roberta": ["query", "value"],
    "electra": ["query", "value"], "deberta-v2": ["query_proj", "value_proj"], "deberta": ["in_proj"],
    "layoutlm": ["query", "value"], "llama": ["q_proj", "v_proj"], "chatglm": ["query_key_value"],
    "gpt_bigcode": ["c_attn"], "mpt": ["Wqkv"], "RefinedWebModel": ["query_key_value"],
    "RefinedWeb": ["query_key_value"], "falcon": ["query_key_value"], "btlm": ["c_proj", "c_attn"],
    "codegen": ["qkv_proj"], "mistral": ["q_proj", "v_proj"], "mixtral": ["q_proj", "v_proj"],
    "stablelm": ["q_proj", "v_proj"], "phi": ["q_proj", "v_proj", "fc1", "fc2"], "gemma": ["q_proj", "v_proj"],
}
