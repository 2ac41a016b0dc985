"""Generation with a model whose language-model head is tensor parallel, as optimum-neuron's
``GeneralNeuronGenerationMixin`` does it for NxD's scripts: Hugging Face's ``generate`` drives the
search and sampling, and every forward's vocab-sharded logits (NxD's ``ColumnParallelLinear(gather_output=False)``
head) are gathered over the tensor-parallel group first, so each TP rank samples from the whole
vocabulary and draws the same tokens. NxD's fine-tuning example calls it through
``optimum.neuron.utils.training_utils.patch_generation_mixin_to_general_neuron_generation_mixin``,
which ``nxd-compat-run`` provides where optimum-neuron (Neuron only) is absent."""

from __future__ import annotations

import inspect
from functools import wraps
from typing import Any, Callable

import torch
from transformers import GenerationMixin

from neuronx_distributed.parallel_layers import parallel_state
from neuronx_distributed.parallel_layers.mappings import gather_from_tensor_model_parallel_region


def _pad_right(tensor: torch.Tensor, length: int, value: int) -> torch.Tensor:
    return torch.nn.functional.pad(tensor, (0, length - tensor.shape[-1]), value=value)


def _forward_for_generation(forward: Callable[..., Any], vocab_size: int, pad_id: int) -> Callable[..., Any]:
    tp = parallel_state.get_tensor_model_parallel_size() if parallel_state.model_parallel_is_initialized() else 1
    takes_position_ids = "position_ids" in inspect.signature(forward).parameters

    @wraps(forward)
    def generation_forward(*args: Any, **kwargs: Any) -> Any:
        input_ids = kwargs["input_ids"]
        length = input_ids.shape[-1]
        # Sequence parallelism splits the sequence over the TP ranks: pad on the right to a multiple of
        # TP (optimum-neuron pads to max_length for XLA's static shapes). Under causal attention the
        # padding never changes the logits of the positions before it, which are all that is kept.
        padded = -(-length // tp) * tp
        if padded != length:
            kwargs["input_ids"] = _pad_right(input_ids, padded, pad_id)
            if kwargs.get("attention_mask") is not None:
                kwargs["attention_mask"] = _pad_right(kwargs["attention_mask"], padded, 0)
                if takes_position_ids:  # as optimum-neuron: positions of the padded mask
                    position_ids = kwargs["attention_mask"].long().cumsum(-1) - 1
                    kwargs["position_ids"] = position_ids.masked_fill_(kwargs["attention_mask"] == 0, 1)
        outputs = forward(*args, **kwargs)
        if tp > 1 and outputs["logits"].shape[-1] != vocab_size:
            outputs["logits"] = gather_from_tensor_model_parallel_region(outputs["logits"])
        outputs["logits"] = outputs["logits"][:, :length]
        return outputs

    return generation_forward


class GeneralNeuronGenerationMixin(GenerationMixin):
    """``generate`` over a tensor-parallel model: the logits of each step gathered over TP, no KV
    cache (as optimum-neuron: each step reruns the whole sequence)."""

    @torch.no_grad()
    def generate(self, inputs: torch.Tensor | None = None, generation_config: Any = None, **kwargs: Any) -> Any:
        kwargs["use_cache"] = False
        own_forward = self.__dict__.get("forward")  # an instance-level forward (a wrapper's) comes back after
        # any id pads: its positions come after every kept one
        self.forward = _forward_for_generation(self.forward, self.config.vocab_size, self.config.pad_token_id or 0)
        try:
            return super().generate(inputs, generation_config, **kwargs)
        finally:
            del self.forward
            if own_forward is not None:
                self.forward = own_forward


def patch_generation_mixin_to_general_neuron_generation_mixin(model: torch.nn.Module) -> None:
    """optimum-neuron's name: ``model.generate`` becomes :class:`GeneralNeuronGenerationMixin`'s."""
    cls = type(model)
    if not issubclass(cls, GeneralNeuronGenerationMixin):
        model.__class__ = type(cls.__name__, (GeneralNeuronGenerationMixin, cls), {"__module__": cls.__module__})
