"""NxD's Neuron-PT-Lightning Llama example (the developer guide's script) on nxd.

Only the imports differ from NxD's version:

    import torch_xla.core.xla_model as xm                      -> from nxd_lightning import xm
    from neuronx_distributed.parallel_layers import parallel_state -> from nxd_core_parallel import parallel_state
    from neuronx_distributed.lightning import (...)             -> from nxd_lightning import (...)
    from neuronx_distributed import initialize_parallel_optimizer -> from nxd import initialize_parallel_optimizer
    import neuronx_distributed as nxd                           -> import nxd

Run on 2 CPU ranks with TP=2 (the embedded corpus; a few seconds per step):

    torchrun --nproc_per_node=2 -m nxd_lightning.examples.llama_tp_pretrain --tp 2 --max_steps 20
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint

import nxd
from nxd import initialize_parallel_optimizer
from nxd_core_parallel import parallel_state
from nxd_lightning import (
    NeuronDataLoader,
    NeuronLightningDataModule,
    NeuronLTModule,
    NeuronTensorBoardLogger,
    NeuronTQDMProgressBar,
    NeuronXLAPrecisionPlugin,
    NeuronXLAStrategy,
    xm,
)
from nxd_models_llama import LlamaConfig, LlamaForCausalLM
from nxd_training.schedules import linear, make_scheduler


# ----------------------------------------------------------------------------- the guide's module
class NeuronLlamaLTModule(NeuronLTModule):
    def training_step(self, batch, batch_idx):
        xm.mark_step()  # Isolate forward+backward graph
        for logger in self.trainer.loggers:
            logger.print_step = -1
        self.should_print = False
        outputs = self.model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            labels=batch["labels"],
        )
        loss = outputs.loss / self.grad_accum_steps
        loss.backward()
        self.averaged_loss += loss.detach()
        xm.mark_step()  # Isolate forward+backward graph
        if not self.automatic_optimization and (batch_idx + 1) % self.grad_accum_steps == 0:
            self.should_print = True
            loss_div = self.averaged_loss / self.trainer.strategy.data_parallel_size
            loss_reduced = xm.all_reduce(
                xm.REDUCE_SUM,
                loss_div,
                groups=parallel_state.get_data_parallel_group(as_list=True),
            )
            loss_reduced_detached = loss_reduced.detach()
            self.averaged_loss.zero_()
            optimizer = self.optimizers()
            scheduler = self.lr_schedulers()
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
            xm.mark_step()  # Isolate Optimization step graph

            # Setup items for logging
            self.loss = loss_reduced_detached
        return loss

    def configure_optimizers(self):
        param_groups = self.get_param_groups_by_weight_decay()
        optimizer = initialize_parallel_optimizer(
            self.nxd_config, self.opt_cls, param_groups, **self.opt_kwargs
        )
        optimizer.zero_grad()
        scheduler = self.scheduler_cls(optimizer, *self.scheduler_args, **self.scheduler_kwargs)
        return (
            [optimizer],
            [
                {
                    "scheduler": scheduler,
                }
            ],
        )

    def on_train_batch_end(self, *args, **kwargs):
        if self.should_print:
            if not self.automatic_optimization:
                self.log(
                    "loss",
                    self.loss.detach().cpu().item() if self.loss is not None else torch.zeros(1, device="cpu", requires_grad=False),
                    prog_bar=True,
                )
                self.log(
                    "global_step",
                    self.global_step,
                    prog_bar=True,
                    on_step=True,
                    on_epoch=True,
                )
                for logger in self.trainer.loggers:
                    logger.print_step = self.global_step


# ----------------------------------------------------------------------------- data and schedule
def create_llama_pretraining_dataset(data_dir: str, batch_size: int, dp_size: int, dp_rank: int, seed: int,
                                     seq_length: int = 128, grad_accum: int = 1, tokenizer: str | None = None,
                                     splits_string: str = "980,20,0") -> NeuronDataLoader:
    """This rank's micro-batches of the indexed dataset ``data_dir`` (an nxd-data ``data_prefix``)."""
    section: dict[str, Any] = {"data_prefix": data_dir, "splits_string": splits_string, "seq_length": seq_length,
                               "micro_batch_size": batch_size, "global_batch_size": batch_size * dp_size * grad_accum}
    if tokenizer:
        section["tokenizer"] = tokenizer
    module = nxd.get_data_module("indexed")(
        section, seq_length=seq_length, micro_batch_size=batch_size, global_batch_size=section["global_batch_size"],
        dp_rank=dp_rank, dp_size=dp_size, seed=seed,
    )
    # the guide's training_step reads batch["attention_mask"]; None = causal
    return NeuronDataLoader(module, extra={"attention_mask": None})


def configure_scheduler(optimizer: torch.optim.Optimizer, warmup_steps: int, max_steps: int):
    """Linear warmup then linear decay to 0 (NxD Training's LinearAnnealingWithWarmUp)."""
    base_lr = optimizer.param_groups[0]["lr"]
    return make_scheduler(optimizer, linear(base_lr, max_steps, warmup_steps=warmup_steps), base_lr)


# ----------------------------------------------------------------------------- the guide's script
def train_llama(flags: argparse.Namespace, callbacks_extra: list | None = None) -> Trainer:
    seed_everything(flags.seed)
    nxd_config = nxd.neuronx_distributed_config(
        tensor_parallel_size=flags.tensor_parallel_size,
        optimizer_config={"zero_one_enabled": flags.use_zero1_optimizer, "grad_clipping": True, "max_grad_norm": 1.0},
    )
    model_config = LlamaConfig.from_dict(flags.model_config)
    optimizer_cls = torch.optim.AdamW

    model = NeuronLlamaLTModule(
        model_fn = LlamaForCausalLM,
        nxd_config = nxd_config,
        model_args = (model_config,),
        opt_cls = optimizer_cls,
        scheduler_cls = configure_scheduler,
        opt_kwargs = {
            "lr": flags.lr,
        },
        scheduler_args = (flags.warmup_steps, flags.max_steps),
        grad_accum_steps = flags.grad_accum_usteps,
        manual_opt = True,
    )

    dm = NeuronLightningDataModule(
        create_llama_pretraining_dataset,
        flags.data_dir,
        flags.batch_size,
        data_args = (flags.seed,),
        data_kwargs = {"seq_length": flags.seq_length, "grad_accum": flags.grad_accum_usteps,
                       "tokenizer": flags.tokenizer},
    )

    strategy = NeuronXLAStrategy(
        nxd_config = nxd_config
    )
    plugins = []
    plugins.append(NeuronXLAPrecisionPlugin())
    callbacks = []
    callbacks.append(NeuronTQDMProgressBar())
    if flags.save_checkpoint:
        callbacks.append(
            ModelCheckpoint(
                save_top_k = flags.num_kept_checkpoint,
                monitor="global_step",
                mode="max",
                every_n_train_steps = flags.checkpoint_freq,
                dirpath = flags.checkpoint_dir,
            )
        )
    callbacks.extend(callbacks_extra or [])

    trainer = Trainer(
        strategy = strategy,
        max_steps = flags.steps_this_run,
        plugins = plugins,
        enable_checkpointing = flags.save_checkpoint,
        logger = NeuronTensorBoardLogger(save_dir=flags.log_dir),
        log_every_n_steps = 1,
        callbacks = callbacks,
        accelerator = "cpu",
        devices = flags.devices,
        enable_model_summary = False,
    )
    trainer.fit(model=model, datamodule=dm, ckpt_path=flags.resume_ckpt_path)
    return trainer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data_dir", help="indexed dataset prefix (default: the embedded quickstart corpus)")
    p.add_argument("--tokenizer", help="tokenizer of --data_dir")
    p.add_argument("--tensor_parallel_size", "--tp", type=int, default=2)
    p.add_argument("--use_zero1_optimizer", action="store_true")
    p.add_argument("--devices", type=int, default=2, help="ranks on this node (as launched by torchrun)")
    p.add_argument("--batch_size", type=int, default=4)
    p.add_argument("--grad_accum_usteps", type=int, default=2)
    p.add_argument("--seq_length", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup_steps", type=int, default=5)
    p.add_argument("--max_steps", type=int, default=40)
    p.add_argument("--steps_this_run", type=int, default=None)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--log_dir", default="lightning_logs")
    p.add_argument("--save_checkpoint", action="store_true")
    p.add_argument("--checkpoint_dir", default="checkpoints")
    p.add_argument("--checkpoint_freq", type=int, default=10)
    p.add_argument("--num_kept_checkpoint", type=int, default=2)
    p.add_argument("--resume_ckpt_path", default=None)
    flags = p.parse_args(argv)
    flags.steps_this_run = flags.steps_this_run or flags.max_steps
    flags.model_config = {"vocab_size": 4096, "hidden_size": 128, "intermediate_size": 352, "num_hidden_layers": 4,
                          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}
    return flags


def main(argv: list[str] | None = None) -> None:
    flags = parse_args(argv)
    if flags.data_dir is None:
        from pathlib import Path

        from nxd_data.quickstart import prepare_quickstart_data

        cache = Path.home() / ".cache" / "nxd" / "quickstart"
        data = prepare_quickstart_data(cache, vocab_size=flags.model_config["vocab_size"])
        flags.data_dir, flags.tokenizer = data["data_prefix"], data["tokenizer"]
    train_llama(flags)


if __name__ == "__main__":
    main()
