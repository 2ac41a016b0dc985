"""NxD's model and optimizer wrappers: ``NxDModel`` and ``NxDOptimizer``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from nxd.run_config import RunConfig
from nxd_core_parallel import dp_overlap
from nxd_core_parallel.loss_terms import add_loss_terms
from nxd_core_parallel.wrapped_optimizer import NxDOptimizer  # noqa: F401 - NxD's names live together here
from nxd_core_parallel.wrapper import ForwardsToModule


def _loss_of(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    if loss is None and isinstance(output, (tuple, list)) and output:
        loss = output[0]
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"run_train needs the model to return a loss tensor (or an object with .loss), got {type(output).__name__}")
    return loss


#: ``loss_fn(micro_batch)`` of the step contract: a loss tensor (or an output with ``.loss``)
LossFn = Callable[[dict], Any]


def _refuse_pipeline_loss_fn(loss_fn: LossFn | None) -> None:
    if loss_fn is not None:
        raise ValueError("loss_fn is not supported under pipeline parallelism: the last pipeline stage computes "
                         "the loss (the model's nxd_pipeline_head)")


def _terms_kwarg(loss_terms: dict | None) -> dict[str, Any]:
    """``loss_terms`` for a pipelined module's step contract, passed only when asked for (a module
    written before it existed keeps working)."""
    return {} if loss_terms is None else {"loss_terms": loss_terms}


def _is_micro_batches(args: tuple, kwargs: dict) -> bool:
    return bool(args) and not kwargs and all(isinstance(a, dict) for a in args)


def autocast_context(batch: dict, dtype: torch.dtype | None) -> Any:
    """``torch.autocast`` on the batch's device for ``dtype``; no-op for ``None``."""
    if dtype is None:
        return contextlib.nullcontext()
    device = next((v.device for v in batch.values() if isinstance(v, torch.Tensor)), torch.device("cpu"))
    return torch.autocast(device_type=device.type, dtype=dtype)


class NxDModel(ForwardsToModule, nn.Module):
    """Wraps the built model. Behaves as the wrapped module: attributes, ``named_parameters`` and
    ``state_dict`` are the local module's, with unprefixed names."""

    def __init__(self, module: nn.Module, nxd_config: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.module = module
        self.nxd_config = RunConfig.of(nxd_config)

    # ---------------------------------------------------------------- NxD API
    def local_module(self) -> nn.Module:
        inner = self.module
        return inner.local_module() if hasattr(inner, "local_module") and callable(inner.local_module) else inner

    def local_modules(self) -> Iterator[tuple[str, nn.Module]]:
        yield from self.local_module().named_modules()

    def original_module(self) -> nn.Module:
        return self.module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Like ``DistributedDataParallel.no_sync``: backward passes run inside this context do not
        start the overlapped data-parallel all-reduce, so gradients accumulate locally; the first
        backward outside it (the last micro-batch) or ``NxDOptimizer.step`` averages the sum.
        Skipping it is still correct, only slower (every micro-batch is then all-reduced)."""
        with dp_overlap.no_sync():
            yield

    def run_train(self, *args: Any, autocast: torch.dtype | None = None, loss_fn: LossFn | None = None,
                  loss_terms: dict[str, torch.Tensor] | None = None, **kwargs: Any) -> torch.Tensor:
        """Forward + backward; returns the detached loss.

        Two forms: NxD's ``run_train(**batch)`` (one batch), and nxd's step contract
        ``run_train(*micro_batches, autocast=None, loss_fn=None)``: one optimizer step's micro-batches
        (dicts of model inputs), gradients accumulated (synced once, by the last), the mean loss
        returned; forward passes run under ``torch.autocast(dtype=autocast)`` when given, and
        ``loss_fn(micro_batch)`` replaces the model's own loss (e.g. a preference workflow's).
        ``loss_terms``, when given, receives the sum over the micro-batches of each named loss term
        the outputs report (:mod:`nxd_core_parallel.loss_terms`: e.g. an MoE model's ``lm_loss`` and
        ``aux_loss``), detached, the same on every rank of a model replica.
        A pipeline-parallel module runs its schedule instead, in both forms (its last stage computes
        the loss, so it takes no ``loss_fn``).
        """
        if _is_micro_batches(args, kwargs):
            if hasattr(self.module, "run_train"):
                _refuse_pipeline_loss_fn(loss_fn)
                return self.module.run_train(*args, autocast=autocast, **_terms_kwarg(loss_terms))
            return self._accumulate(args, autocast, loss_fn, loss_terms)
        if hasattr(self.module, "run_train"):
            return self.module.run_train(*args, **kwargs)
        loss = _loss_of(self.module(*args, **kwargs))
        loss.backward()
        return loss.detach()

    def _micro_batch_loss(self, batch: dict, loss_fn: LossFn | None,
                          loss_terms: dict[str, torch.Tensor] | None) -> torch.Tensor:
        output = self.module(**batch) if loss_fn is None else loss_fn(batch)
        if loss_terms is not None:
            add_loss_terms(loss_terms, output)
        return _loss_of(output)

    def _accumulate(self, micro_batches: tuple[dict, ...], autocast: torch.dtype | None,
                    loss_fn: LossFn | None, loss_terms: dict[str, torch.Tensor] | None) -> torch.Tensor:
        n = len(micro_batches)
        total: torch.Tensor | None = None
        for i, batch in enumerate(micro_batches):
            # forward and backward both inside: the overlap hooks check no_sync as they fire
            with self.no_sync() if i < n - 1 else contextlib.nullcontext():
                with autocast_context(batch, autocast):
                    loss = self._micro_batch_loss(batch, loss_fn, loss_terms)
                (loss / n).backward()
            part = loss.detach().float() / n
            total = part if total is None else total + part
        assert total is not None
        return total

    def run_eval(self, *args: Any, autocast: torch.dtype | None = None, loss_fn: LossFn | None = None,
                 loss_terms: dict[str, torch.Tensor] | None = None, **kwargs: Any) -> Any:
        """Forward only: NxD's ``run_eval(**batch)``, or ``run_eval(*micro_batches, autocast=None,
        loss_fn=None, loss_terms=None)`` returning the mean loss over the micro-batches (``loss_terms``
        as for ``run_train``)."""
        if _is_micro_batches(args, kwargs):
            if hasattr(self.module, "run_eval"):
                _refuse_pipeline_loss_fn(loss_fn)
                return self.module.run_eval(*args, autocast=autocast, **_terms_kwarg(loss_terms))
            with torch.no_grad():
                losses = []
                for batch in args:
                    with autocast_context(batch, autocast):
                        losses.append(self._micro_batch_loss(batch, loss_fn, loss_terms).detach().float())
                return torch.stack(losses).mean()
        if hasattr(self.module, "run_eval"):
            return self.module.run_eval(*args, **kwargs)
        with torch.no_grad():
            return _loss_of(self.module(*args, **kwargs)).detach()

    # ------------------------------------------------ local-rank views, unprefixed (nn.Module's
    # parameters() and buffers() read these two)
    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        return self.local_module().named_parameters(prefix=prefix, recurse=recurse, remove_duplicate=remove_duplicate)

    def named_buffers(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        return self.local_module().named_buffers(prefix=prefix, recurse=recurse, remove_duplicate=remove_duplicate)

    def state_dict(self, *args: Any, **kwargs: Any):
        return self.local_module().state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False):
        return self.local_module().load_state_dict(state_dict, strict=strict, assign=assign)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype
