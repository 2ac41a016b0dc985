"""``NeuronLTModule``: NxD's LightningModule base, with NxD's constructor arguments.

``setup()`` builds the model with ``nxd.initialize_parallel_model`` (TP layers, activation
checkpointing, pipeline, LoRA per ``nxd_config``); ``configure_optimizers()`` wraps ``opt_cls``
with ``nxd.initialize_parallel_optimizer`` over weight-decay parameter groups and builds
``scheduler_cls(optimizer, *scheduler_args, **scheduler_kwargs)``.

``manual_opt=True`` (NxD's default) leaves forward/backward/step to the subclass's
``training_step``, as in NxD's examples. ``manual_opt=False`` uses Lightning's automatic
optimisation, which NxD did not offer: the default ``training_step`` returns the model's loss,
gradient accumulation is ``grad_accum_steps`` micro-batches per optimizer step, and ``self.loss``
holds the data-parallel mean loss of the last step (the same number the YAML trainer reports).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch import LightningModule

import nxd
from nxd import ConfigError
from nxd.config import check_config


class NeuronLTModule(LightningModule):
    def __init__(
        self,
        nxd_config: dict,
        opt_cls: type[torch.optim.Optimizer],
        scheduler_cls: Callable[..., Any] | None,
        model_args: tuple = (),
        model_kwargs: dict | None = None,
        opt_args: tuple = (),
        opt_kwargs: dict | None = None,
        scheduler_args: tuple = (),
        scheduler_kwargs: dict | None = None,
        model_fn: Callable[..., torch.nn.Module] | None = None,
        grad_accum_steps: int = 1,
        train_batch_size: int = 16,
        logging_interval: int = 1,
        log_rank0: bool = False,
        manual_opt: bool = True,
    ) -> None:
        super().__init__()
        check_config(nxd_config)
        self.nxd_config = nxd_config  # NxD's dict, as the user passed it (nxd's entry points read its RunConfig)
        # As NxD: model_fn may be None when a subclass builds the model in its own setup().
        if model_fn is None and type(self).setup is NeuronLTModule.setup or model_fn is not None and not callable(model_fn):
            raise ConfigError(f"NeuronLTModule: model_fn must be a callable that returns an nn.Module (or override "
                              f"setup() to build self.model), got {model_fn!r}")
        if isinstance(grad_accum_steps, bool) or not isinstance(grad_accum_steps, int) or grad_accum_steps < 1:
            raise ConfigError(f"NeuronLTModule: grad_accum_steps must be a positive integer, got {grad_accum_steps!r}")
        self.model_fn = model_fn
        self.model_args, self.model_kwargs = tuple(model_args), dict(model_kwargs or {})
        self.opt_cls, self.opt_args, self.opt_kwargs = opt_cls, tuple(opt_args), dict(opt_kwargs or {})
        self.scheduler_cls = scheduler_cls
        self.scheduler_args, self.scheduler_kwargs = tuple(scheduler_args), dict(scheduler_kwargs or {})
        self.grad_accum_steps = grad_accum_steps
        self.train_batch_size = train_batch_size
        self.logging_interval = logging_interval
        self.log_rank0 = log_rank0
        self.manual_opt = manual_opt
        self.automatic_optimization = not manual_opt
        self.model: Any = None
        # Step bookkeeping the examples use (NxD keeps the same attributes).
        self.averaged_loss = torch.zeros(())
        self.loss: torch.Tensor | None = None
        self.should_print = False

    # ------------------------------------------------------------------ building
    def setup(self, stage: str | None = None, include_buffers: bool = False) -> None:
        if self.model is None:
            self.model = nxd.initialize_parallel_model(self.nxd_config, self.model_fn, include_buffers,
                                                       *self.model_args, **self.model_kwargs)
        self.averaged_loss = torch.zeros((), device=self.device_for_loss())
        # NxD's attribute: the pipeline stage whose rank prints and logs (the last, unless log_rank0)
        self.print_pp_rank = 0 if self.log_rank0 or self._trainer is None else \
            getattr(self.trainer.strategy, "pipeline_parallel_size", 1) - 1
        if self.automatic_optimization and self._trainer is not None:
            # Lightning's own accumulation (loss / N per micro-batch, one step every N batches).
            self.trainer.accumulate_grad_batches = self.grad_accum_steps

    def device_for_loss(self) -> torch.device:
        from nxd_core_parallel.backends import get_device

        return get_device()

    def get_param_groups_by_weight_decay(self, weight_decay: float = 0.01) -> list[dict]:
        """Weight decay on matrices; none on biases and norm weights (any 1-D parameter, so
        RMSNorm/LayerNorm are caught whatever they are called). Override for your own rule."""
        decay, no_decay = [], []
        for name, param in self.model.named_parameters():
            if not param.requires_grad:
                continue
            (no_decay if param.dim() < 2 or name.endswith(".bias") else decay).append(param)
        groups = [{"params": decay, "weight_decay": weight_decay}]
        if no_decay:
            groups.append({"params": no_decay, "weight_decay": 0.0})
        return groups

    def configure_optimizers(self) -> Any:
        param_groups = self.get_param_groups_by_weight_decay()
        optimizer = nxd.initialize_parallel_optimizer(self.nxd_config, self.opt_cls, param_groups, *self.opt_args,
                                                      **self.opt_kwargs)
        optimizer.zero_grad()
        if self.scheduler_cls is None:
            return optimizer
        scheduler = self.scheduler_cls(optimizer, *self.scheduler_args, **self.scheduler_kwargs)
        # per optimizer step, as the YAML trainer (Lightning's default interval is an epoch)
        return [optimizer], [{"scheduler": scheduler, "interval": "step"}]

    def configure_gradient_clipping(self, optimizer: Any, gradient_clip_val: Any = None,
                                    gradient_clip_algorithm: Any = None) -> None:
        pass  # nxd's optimizer clips (optimizer_config.grad_clipping / max_grad_norm)

    # ------------------------------------------------------------------ training
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)

    def dp_mean(self, value: torch.Tensor) -> torch.Tensor:
        """Mean of ``value`` over the data-parallel group (the global loss)."""
        from nxd_core_parallel import parallel_state as ps

        value = value.detach().clone()
        if dist.is_initialized() and ps.model_parallel_is_initialized() and ps.get_data_parallel_size() > 1:
            dist.all_reduce(value, group=ps.get_data_parallel_group())
            value /= ps.get_data_parallel_size()
        return value

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> Any:
        """Automatic optimisation: the model's loss for one micro-batch (Lightning divides it by
        the accumulation count, runs backward and steps every ``grad_accum_steps`` batches)."""
        if not self.automatic_optimization:
            raise NotImplementedError("NeuronLTModule(manual_opt=True): override training_step with the "
                                      "forward, backward and optimizer step (see the examples)")
        loss = self.model(**batch).loss
        self.averaged_loss += loss.detach().float() / self.grad_accum_steps
        self.should_print = (batch_idx + 1) % self.grad_accum_steps == 0
        if self.should_print:
            self.loss = self.dp_mean(self.averaged_loss)
            self.averaged_loss.zero_()
        return loss

    def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
        if self.automatic_optimization and self.should_print and self.loss is not None:
            self.log("loss", self.loss.item(), prog_bar=True)
