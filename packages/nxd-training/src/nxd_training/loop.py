"""The training loop one rank runs: build, (auto-)resume, step, validate, log, checkpoint."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import nxd
from nxd import ConfigError
from nxd.dtypes import torch_dtype
from nxd_ckpt.run_dir import MODEL_RECORD_KEY, checkpoint_has_adapters, model_record
from nxd_training import build, lora_export, metrics, rank_status
from nxd_training.config.plan import build_workflow, resolve_config, tokenizer_path
from nxd_training.config.resolved import model_config_of, model_spec_of
from nxd_training.config.schema import TrainingConfig
from nxd_training.exp_manager import (
    MetricsLogger,
    checkpoint_dir,
    checkpoint_tag,
    is_url,
    kept_checkpoints,
    resolve_log_dir,
    should_save,
    split_checkpoint_path,
)
from nxd_training.hang import COLLECTIVE_ATTR, locate_collective
from nxd_training.profiling import StepProfiler
from nxd_training.readback import StepReadback
from nxd_training.resume_rules import data_position_refusal
from nxd_training.runtime import ensure_process_group, parse_max_time, seed_everything, select_backend

#: batch keys the model's forward takes (a data module may add others, e.g. segment_ids)
MODEL_INPUTS = ("input_ids", "labels", "position_ids", "attention_mask", "loss_mask")
#: the names of a step's numbers in its StepReadback (metrics keep their own names after the prefix)
LOSS_KEY, GRAD_NORM_KEY, METRIC_PREFIX = "loss", "grad_norm", "metric/"


@dataclass
class _PendingStep:
    """A launched step whose numbers the loop has not read yet."""

    step: int
    numbers: StepReadback
    lr: float
    started_s: float



@dataclass
class TrainResult:
    """What a rank returns: per-step global losses of this invocation and where it stopped."""

    log_dir: str
    start_step: int
    final_step: int
    losses: dict[int, float] = field(default_factory=dict)
    valid_losses: dict[int, float] = field(default_factory=dict)
    #: step metrics (a workflow's: rewards/chosen, ...; the model's named loss terms: lm_loss, ...), DP means
    metrics: dict[int, dict[str, float]] = field(default_factory=dict)
    resumed_from: str | None = None
    #: model.pretrained_checkpoint: the Hugging Face folder the weights came from (a fresh start)
    initialised_from: str | None = None
    samples: list[str] = field(default_factory=list)
    wall_time_s: float = 0.0
    #: (trainable, total) parameter elements on this rank
    trainable_params: tuple[int, int] = (0, 0)
    #: LoRA runs: the folders the adapter was exported to (``<dir>/lora_adapter`` etc.)
    lora_exports: list[str] = field(default_factory=list)
    #: trainer.profile: the torch.profiler traces this rank wrote
    profile_traces: list[str] = field(default_factory=list)
    #: trainer.profile.profile_memory on the CPU: the peak tensor bytes of the profiled steps
    profile_peak_memory_bytes: int | None = None


class Trainer:
    """One rank's training run (created by :func:`train`). ``config`` is the resolved config
    (``nxd train``'s ranks get it deserialised from the run directory); a plain TrainingConfig
    (the Python API) is resolved here, once."""

    def __init__(self, config: TrainingConfig, log_dir: Path | None = None) -> None:
        self.config = config = resolve_config(config)
        #: the RunConfig every hook and transform gets: the one `nxd train` translated and validated, read back
        self.run = run = config.run
        derived = run.derived  # the model, batch numbers, data section: recorded by the resolution, not derived again
        self.spec = model_spec_of(run)
        self.model_config = model_config_of(run, self.spec)
        self.backend = select_backend(config.trainer)
        seed_everything(config.seed)
        # distributed_strategy.collective_timeout bounds the default group's and every parallel group's collectives
        timeout = timedelta(seconds=config.distributed_strategy.collective_timeout)
        self.owns_group = ensure_process_group(derived.world_size, self.backend, timeout)
        from nxd_core_parallel.context import start_parallel_context

        # the run's groups, with its timeout, before anything else builds them (neuronx_distributed_config
        # keeps a current context of the same sizes: groups start once)
        self.context = start_parallel_context(**run.sizes(), timeout=timeout)
        build_fn = build.model_builder(config, self.spec, self.context)  # the model spec gets the context
        self.rank = dist.get_rank()
        self.log_dir = Path(log_dir) if log_dir is not None else resolve_log_dir(config)
        self.ckpt_dir = checkpoint_dir(config.exp_manager, self.log_dir)
        from nxd_core_parallel.random import model_parallel_manual_seed

        self.device = self.context.device
        model_parallel_manual_seed(config.seed, self.context)
        self.model = nxd.initialize_parallel_model(run, build_fn, False, self.model_config, run)
        #: the step contract's ``autocast`` dtype (``precision.type: autocast`` or ``fp8``: bf16 forward passes)
        self.autocast = torch_dtype(run.autocast_dtype)
        lora = run.lora_config  # NxD's LoraConfig fields, translated once with the run config (None: no LoRA)
        self.lora = lora is not None
        self.trainable = lora_export.trainable_counts(self.model)
        if self.lora and dist.get_rank() == 0:
            print(f"nxd train: LoRA: {lora_export.describe(self.trainable)}", flush=True)
        self.lora_exports: list[str] = []
        self.initialised_from: str | None = None
        #: exp_manager.resume_from_checkpoint with model.weight_init_only: the checkpoint the weights came from
        self.weights_from: str | None = None
        #: what the checkpoints record of the model, so `nxd ckpt convert RUN_DIR` needs no arguments
        self.model_record = model_record(self.spec.name, derived.model, tokenizer_path(config.data),
                                         lora)
        if self.lora and is_url(self.ckpt_dir):
            raise ConfigError(f"LoRA exports are written to a local directory, and checkpoint_callback_params.dirpath "
                              f"is the URL {self.ckpt_dir}; use a local dirpath for LoRA runs")
        groups = build.param_groups(self.model, config.model.do_layer_norm_weight_decay)
        self.optimizer = build.build_optimizer(config.model.optim, groups, run, self.context)
        self.scheduler = build.build_scheduler(config.model.optim, config.trainer.max_steps, self.optimizer)
        self.dp_rank = self.context.dp.rank
        self.dp_group = self.context.dp.group
        self.data = build.build_data(config.data, config.seed, derived, self.context)
        #: model_alignment_strategy's workflow (dpo, orpo, ...): its loss replaces the model's
        self.workflow = build_workflow(config.model_alignment_strategy)[1]
        self.step_metrics: dict[str, float] = {}
        self.valid_metrics: dict[str, float] = {}
        self.step = 0
        self.logger = MetricsLogger(config.exp_manager, self.log_dir, enabled=self.rank == 0)
        self.peak = metrics.peak_tflops(self.backend, config.exp_manager.peak_tflops_per_device)
        self.fpt = metrics.flops_per_token(self.spec, self.model_config, derived.seq_length)
        self.tokens_per_step = config.data.global_batch_size * self.run.derived.seq_length
        self.profiler = StepProfiler(config.trainer.profile, self.log_dir, self.rank, self.device)

    # ------------------------------------------------------------------ resume
    def _data_states(self) -> list[Any]:
        """Every DP rank's data position (saved together: user_content is written once)."""
        states: list[Any] = [None] * self.run.derived.dp
        dist.all_gather_object(states, self.data.state_dict(), group=self.dp_group)
        return states

    def resume(self) -> str | None:
        em = self.config.exp_manager
        path = self.ckpt_dir  # a local path or a URL (s3://...): the checkpointer's storages handle both
        if em.resume_if_exists and nxd.has_checkpoint(path, context=self.context):
            content = nxd.load_checkpoint(path, tag=None, model=self.model, optimizer=self.optimizer,
                                          scheduler=self.scheduler, context=self.context)
            self._restore(content)
            return f"{path} (step {self.step})"
        if em.resume_if_exists and not em.resume_ignore_no_checkpoint:
            raise ConfigError(f"exp_manager.resume_if_exists: no complete checkpoint in {path} "
                              "(set resume_ignore_no_checkpoint: true to start fresh)")
        # a checkpoint to resume or evaluate holds every weight: it wins over the pretrained source (the HF
        # folder the run started from), which is then not read; the log line says which one gave the weights
        pretrained = self.config.model.pretrained_checkpoint
        if em.resume_from_checkpoint:
            parent, tag = split_checkpoint_path(em.resume_from_checkpoint)
            weights_only = self.config.model.weight_init_only
            # LoRA fine-tuning from a base model's checkpoint: its weights load under the adapters; a LoRA
            # run's own checkpoint (it records its adapters) loads whole, adapters included
            base_only = self.lora and weights_only and not checkpoint_has_adapters(parent, tag)
            target = lora_export.base_module(self.model) if base_only else self.model
            content = nxd.load_checkpoint(parent, tag=tag, model=target,
                                          optimizer=None if weights_only else self.optimizer,
                                          scheduler=None if weights_only else self.scheduler, context=self.context,
                                          load_rng=not weights_only)  # weights only: a fresh start keeps its seed
            unused = ("" if not pretrained else f"; model.pretrained_checkpoint {pretrained} not read"
                      if build.loads_pretrained_late(self.config) else f"; the NF4 base quantised from {pretrained}")
            if weights_only:
                self._weights_changed()
                self.weights_from = (f"{em.resume_from_checkpoint} (model.weight_init_only: the optimizer, schedule "
                                     f"and data position start fresh{unused})")
                return None
            self._restore(content)
            return f"{em.resume_from_checkpoint} (step {self.step}{unused})"
        if pretrained:
            # the base model (under LoRA adapters, if any) takes the folder's weights; the optimizer starts fresh.
            # QLoRA's base read them before it was quantised (build.model_builder)
            if build.loads_pretrained_late(self.config):
                build.load_pretrained(self.spec, self.model, self.lora, pretrained)
                self._weights_changed()
            self.initialised_from = pretrained
            return None
        return None

    def _weights_changed(self) -> None:
        """New weights without optimizer state: an optimizer holding fp32 master copies (ZeRO-1) takes
        them from the parameters (NxD's ``init_zero``)."""
        reload = getattr(self.optimizer, "init_zero", None)
        if callable(reload):
            reload()

    def _restore(self, content: Any) -> None:
        if not isinstance(content, dict) or "step" not in content:
            raise ConfigError(f"checkpoint in {self.ckpt_dir} has no training position (user_content.step); "
                              "was it written by nxd train?")
        self.step = int(content["step"])
        states = content.get("data")
        if states:
            refusal = data_position_refusal(len(states), self.run.derived.dp, f"the checkpoint in {self.ckpt_dir}")
            if refusal:
                raise ConfigError(refusal)
            self.data.load_state_dict(states[self.dp_rank])

    # ------------------------------------------------------------------ steps
    def _model_inputs(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The keys the model (or the workflow) takes, on the device; under context parallelism
        this CP rank's chunks of every sequence (with their positions)."""
        from nxd_context_parallel import split_batch_for_context_parallel

        moved = {k: v.to(self.device) for k, v in batch.items() if self.workflow is not None or k in MODEL_INPUTS}
        cp = self.context.cp
        return moved if self.workflow is not None else split_batch_for_context_parallel(moved, cp.rank, cp.size)

    def _loss_fn(self, sums: dict[str, torch.Tensor]) -> Any:
        """The step contract's ``loss_fn``: the workflow's loss, its metrics summed into ``sums``;
        ``None`` (the model's own loss) without a workflow."""
        if self.workflow is None:
            return None

        def loss_fn(batch: dict[str, torch.Tensor]) -> torch.Tensor:
            loss, extra = self.workflow.loss(self.model, batch)
            for name, value in extra.items():
                sums[name] = sums.get(name, 0) + value.detach().float()
            return loss

        return loss_fn

    def _dp_means(self, loss: torch.Tensor, sums: dict[str, torch.Tensor], count: int) -> dict[str, torch.Tensor]:
        """The logged numbers, averaged over data parallelism in one all-reduce (on the device): the
        step contract's ``loss`` (the same on every rank of a model replica, pipeline stages included)
        under LOSS_KEY, and per-micro-batch ``sums`` (a workflow's metrics, the model's named loss
        terms) as means over the ``count`` micro-batches under METRIC_PREFIX + name."""
        names = sorted(sums)  # the same order on every rank
        stacked = torch.stack([loss.detach().float(), *(sums[n].detach().float() / count for n in names)])
        if self.run.derived.dp > 1:
            dist.all_reduce(stacked, group=self.dp_group)
            stacked /= self.run.derived.dp
        return dict(zip([LOSS_KEY, *(METRIC_PREFIX + n for n in names)], stacked.unbind()))

    def train_step(self, it: Iterator[dict[str, torch.Tensor]]) -> StepReadback:
        """One optimizer step through the step contract, for every parallel layout. Its numbers
        (loss, grad norm, metrics) come back as a :class:`StepReadback`, read by the loop one step
        late: nothing in the step waits for the device."""
        self.model.train()
        sums: dict[str, torch.Tensor] = {}
        loss_fn = self._loss_fn(sums)
        micro_batches = [self._model_inputs(next(it)) for _ in range(self.run.derived.num_microbatches)]
        total = self.model.run_train(*micro_batches, autocast=self.autocast, loss_fn=loss_fn, loss_terms=sums)
        numbers = self._dp_means(total, sums, len(micro_batches))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        grad_norm = getattr(self.optimizer, "grad_norm", None)
        if grad_norm is not None and self.config.exp_manager.log_gradient_norm:
            numbers[GRAD_NORM_KEY] = grad_norm if torch.is_tensor(grad_norm) else torch.tensor(float(grad_norm))
        return StepReadback(numbers)

    def _valid_groups(self, cap: int | None) -> Iterator[list[dict[str, torch.Tensor]]]:
        """Validation inputs, ``num_microbatches`` micro-batches at a time (one ``run_eval`` each, as
        a training step); the last group may be shorter."""
        group: list[dict[str, torch.Tensor]] = []
        for n, batch in enumerate(self.data.valid_batches()):
            if cap is not None and n >= cap:
                break
            group.append(self._model_inputs(batch))
            if len(group) == self.run.derived.num_microbatches:
                yield group
                group = []
        if group:
            yield group

    @torch.no_grad()
    def validate(self) -> float | None:
        limit = self.config.trainer.limit_val_batches
        count_fn = getattr(self.data, "num_valid_batches", None)
        available = count_fn() if callable(count_fn) else None
        if isinstance(limit, float):
            if limit <= 0:
                return None
            cap = None if available is None else max(1, int(available * limit))
        else:
            # NxDT (Lightning) counts global batches: each is num_microbatches micro-batches per DP rank
            cap = limit * self.run.derived.num_microbatches
        if cap == 0:
            return None
        self.model.eval()
        total, n = torch.zeros((), device=self.device), 0
        sums: dict[str, torch.Tensor] = {}
        for group in self._valid_groups(cap):
            loss = self.model.run_eval(*group, autocast=self.autocast, loss_fn=self._loss_fn(sums), loss_terms=sums)
            # run_eval gives the group's mean: weigh it by its micro-batches
            total += loss.detach().float() * len(group)
            n += len(group)
        self.model.train()
        if not n:
            self.valid_metrics = {}
            return None
        means = StepReadback(self._dp_means(total / n, sums, n)).values()
        self.valid_metrics = {k[len(METRIC_PREFIX):]: v for k, v in means.items() if k.startswith(METRIC_PREFIX)}
        return means[LOSS_KEY]

    def save(self, wall_start: float) -> None:
        consumed = self.step * self.config.data.global_batch_size
        em = self.config.exp_manager
        tag = checkpoint_tag(em.checkpoint_callback_params, self.config.name, self.step, consumed, 0)
        content = {"step": self.step, "consumed_samples": consumed, "data": self._data_states(),
                   "config_name": self.config.name, MODEL_RECORD_KEY: self.model_record}
        record = {"async": int(em.async_checkpointing)}

        def snapshot_waited(seconds: float, step: int = self.step) -> None:
            # the next optimizer step waited this long for the rest of the snapshot copy: the record
            # logged again with the loop's whole stall for this save (read_metrics keeps the last)
            self.logger.log(step, {**record, "blocked_s": record["call_s"] + seconds, "snapshot_wait_s": seconds},
                            prefix="checkpoint")

        started = time.perf_counter()
        # an async save overlaps its copy of parameters and optimizer state with the next forward and
        # backward: this loop changes them only in optimizer.step(), which waits for the copy
        nxd.save_checkpoint(
            self.ckpt_dir, tag=tag, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
            user_content=content, num_kept_ckpts=kept_checkpoints(em.checkpoint_callback_params),
            async_save=em.async_checkpointing,
            zero1_optimizer=self.config.distributed_strategy.zero1, format=em.checkpoint_format,
            overlap_snapshot=em.async_checkpointing, on_snapshot_wait=snapshot_waited, context=self.context,
        )
        # how long the save call stood the loop still (an async save: any wait for the previous save,
        # the buffers' walk and what is not overlapped); split "checkpoint" in metrics.jsonl
        record["call_s"] = record["blocked_s"] = time.perf_counter() - started
        self.logger.log(self.step, record, prefix="checkpoint")
        if self.lora:
            # A synchronous save wrote the export already (nxd-lora's nxd_checkpoint_extras hook);
            # an async one skips the hook while the model keeps training, so export it here.
            if em.async_checkpointing:
                if (Path(self.ckpt_dir) / tag / "done").exists():
                    nxd.finalize_checkpoint()  # an overwrite is swapped in when it commits; write after that
                lora_export.export_lora(self.model, self.ckpt_dir, tag)
            self.lora_exports.append(str(Path(self.ckpt_dir) / tag))

    # ------------------------------------------------------------------ the loop
    def _max_steps(self) -> int:
        tr = self.config.trainer
        steps = tr.max_steps if tr.max_steps > 0 else None
        if tr.max_epochs > 0:
            info = getattr(self.data, "info", {}) or {}
            samples = sum(d.get("train_samples", 0) for d in info.get("datasets", []))
            if not samples:
                raise ConfigError("trainer.max_epochs needs a data module that reports its size; use trainer.max_steps")
            by_epochs = tr.max_epochs * max(1, samples // self.config.data.global_batch_size)
            steps = by_epochs if steps is None else min(steps, by_epochs)
        return steps if steps is not None else 2**62

    def _stop_for_time(self, start: float, limit: float | None) -> bool:
        if limit is None:
            return False
        flag = torch.tensor([1.0 if time.monotonic() - start >= limit else 0.0], device=self.device)  # NCCL: CUDA only
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def fit(self) -> TrainResult:
        wall_start = time.monotonic()
        resumed = self.resume()
        if self.workflow is not None:  # after resume: a restored data state may already hold what it needs
            self.workflow.prepare(self.model, self.data, device=self.device, dp_group=self.dp_group,
                                  resumed_step=self.step)
        result = TrainResult(str(self.log_dir), self.step, self.step, resumed_from=resumed,
                             initialised_from=self.initialised_from)
        max_steps, tr = self._max_steps(), self.config.trainer
        max_time = parse_max_time(tr.max_time)
        val_every = int(tr.val_check_interval)
        if resumed and dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()  # every rank loaded its shards: a rank that failed never gets here, so nothing is claimed
        if self.rank == 0 and resumed:
            print(f"nxd train: resumed from {resumed}", flush=True)
        if self.rank == 0 and self.weights_from:
            print(f"nxd train: weights from checkpoint {self.weights_from}", flush=True)
        if self.rank == 0 and self.initialised_from:
            print(f"nxd train: initialised from HF weights {self.initialised_from}", flush=True)
        bar = self._progress(max_steps)
        self.logger.start(self.step)  # a resumed run drops what was logged after its checkpoint
        it = iter(self.data.train_batches())
        last_save = time.monotonic()
        pending: _PendingStep | None = None
        self._last_ready: float | None = None
        try:
            rank_status.update(max_steps=max_steps, done=self.step)  # done: where this run starts
            while self.step < max_steps:
                # the step in progress, for the launcher's last line; "train": the heartbeat expects steps to complete
                rank_status.update(step=self.step + 1, phase="train")
                self.profiler.before_step(self.step + 1)
                t0 = time.perf_counter()
                lr = self.optimizer.param_groups[0]["lr"]
                numbers = self.train_step(it)
                self.step += 1
                if pending is not None:  # the previous step's numbers, read while this step runs
                    self._record(pending, result, bar, max_steps)
                pending = _PendingStep(self.step, numbers, lr, t0)
                trace = self.profiler.after_step(self.step)
                if trace is not None and self.rank == 0:
                    print(f"nxd train: profiler trace written to {trace}", flush=True)
                if (val_every and self.step % val_every == 0) or should_save(self.config.exp_manager, self.step, last_save,
                                                                             time.monotonic()):
                    self._record(pending, result, bar, max_steps)  # logged before valid/checkpoint
                    pending = None
                if val_every and self.step % val_every == 0:
                    with rank_status.phase("validation"):
                        vloss = self.validate()
                    if vloss is not None:
                        result.valid_losses[self.step] = vloss
                        self.logger.log(self.step, {"loss": vloss, **self.valid_metrics}, prefix="valid")
                if should_save(self.config.exp_manager, self.step, last_save, time.monotonic()):
                    with rank_status.phase("checkpoint"):
                        self.save(wall_start)
                    last_save = time.monotonic()
                if self._stop_for_time(wall_start, max_time):
                    break
            rank_status.update(phase="finish")
            self._record(pending, result, bar, max_steps)
            pending = None
            params = self.config.exp_manager.checkpoint_callback_params
            saved_now = params.every_n_train_steps and self.step % params.every_n_train_steps == 0
            if (self.config.exp_manager.create_checkpoint_callback and params.save_on_train_end
                    and self.step > result.start_step and not saved_now):
                self.save(wall_start)
            if self.config.exp_manager.create_checkpoint_callback:
                nxd.finalize_checkpoint()
            elif self.lora and self.step > result.start_step:  # no checkpoints: export the final adapter
                self.lora_exports.append(str(lora_export.export_lora(self.model, self.log_dir, lora_export.FINAL_TAG)))
        except KeyboardInterrupt:
            self._record(pending, result, bar, max_steps)  # Ctrl-C: the last finished step is still logged
            raise
        finally:
            self.profiler.stop(self.step)  # the run ended inside the profiled window
            if bar is not None:
                bar.close()
            self.logger.close()
        result.final_step = self.step
        result.trainable_params = self.trainable
        result.lora_exports = list(self.lora_exports)
        result.profile_traces = [str(p) for p in self.profiler.traces]
        result.profile_peak_memory_bytes = self.profiler.peak_memory_bytes
        result.wall_time_s = time.monotonic() - wall_start
        if self.config.generation is not None and self.config.generation.prompts:
            from nxd_training.samples import generate_samples

            result.samples = generate_samples(self.config.generation, self.config.data, self.config.seed, self.model,
                                              self.spec)
        return result

    def _progress(self, total: int) -> Any:
        if self.rank != 0 or not self.config.trainer.enable_progress_bar:
            return None
        from tqdm.auto import tqdm

        return tqdm(total=total if total < 2**62 else None, initial=self.step, desc=self.config.name,
                    unit="step", dynamic_ncols=True, mininterval=0.5)

    def _record(self, pending: _PendingStep | None, result: TrainResult, bar: Any, max_steps: int) -> None:
        """Read a finished step's numbers back (waiting for that step only) and log them. Its time is
        from its start, or from the previous step's numbers when those arrived later (the host ran
        ahead): in steady state the device's time per step."""
        if pending is None:
            return
        values = pending.numbers.values()
        ready = pending.numbers.ready_s
        elapsed = ready - max(pending.started_s, self._last_ready or pending.started_s)
        self._last_ready = ready
        loss = values.pop(LOSS_KEY)
        grad_norm = values.pop(GRAD_NORM_KEY, None)
        self.step_metrics = {k[len(METRIC_PREFIX):]: v for k, v in values.items()}
        step, lr = pending.step, pending.lr
        result.losses[step] = loss
        if self.step_metrics:
            result.metrics[step] = dict(self.step_metrics)
        if step % self.config.trainer.log_every_n_steps == 0 or step == max_steps:
            self._log(step, loss, lr, elapsed, grad_norm)
        rank_status.update(done=step)  # after its log line: Ctrl-C's "stopped at step N"
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", **metrics.progress_fields(self.step_metrics))

    def _log(self, step: int, loss: float, lr: float, elapsed: float, grad_norm: float | None) -> None:
        tokens_per_s = self.tokens_per_step / max(elapsed, 1e-9)
        record: dict[str, float | int] = {
            "loss": loss, "lr": lr, "step_time_s": elapsed, "tokens_per_s": tokens_per_s,
            "samples_per_s": self.config.data.global_batch_size / max(elapsed, 1e-9),
            "consumed_samples": step * self.config.data.global_batch_size,
            "peak_memory_mb": metrics.peak_memory_mb(self.backend),
        }
        if self.profiler.peak_memory_bytes is not None:  # trainer.profile.profile_memory on the CPU
            record["peak_tensor_memory_mb"] = self.profiler.peak_memory_bytes / 2**20
        record.update(self.step_metrics)
        if grad_norm is not None:
            record["grad_norm"] = grad_norm
        value = metrics.mfu(tokens_per_s, self.fpt, self.peak, self.run.derived.world_size)
        if value is not None:
            record["mfu"] = value
        self.logger.log(step, record)

    def close(self) -> None:
        # An in-flight async save agrees on its commit over the process group: let it finish (or
        # fail, if a rank died) before the group goes. fit() has already raised a failed save on
        # the normal path; here one can only be the echo of the error that is propagating.
        try:
            nxd.finalize_checkpoint()
        except Exception as exc:  # noqa: BLE001 - reported, never masks the training error
            print(f"nxd train: rank {self.rank}: {exc}", file=sys.stderr, flush=True)
        if self.owns_group and dist.is_initialized():
            with contextlib.suppress(Exception):
                nxd.parallel.destroy_parallel_context()  # the groups this trainer started
            dist.destroy_process_group()


def train(config: TrainingConfig, log_dir: str | Path | None = None) -> TrainResult:
    """Run training on this rank (call it on every rank; one rank needs no launcher)."""
    trainer = Trainer(config, Path(log_dir) if log_dir is not None else None)
    try:
        return trainer.fit()
    except RuntimeError as exc:
        site = locate_collective(exc)  # now: close() destroys the groups that name its ranks
        if site is not None:
            setattr(exc, COLLECTIVE_ATTR, site)
        raise
    finally:
        trainer.close()
