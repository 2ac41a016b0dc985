"""``NxDStrategy`` (alias ``NeuronXLAStrategy``): Lightning's multi-process strategy with nxd's
parallel state (TP, PP, DP; ZeRO-1 through ``nxd_config``) instead of DDP.

The model is not wrapped in DDP: the optimizer from ``nxd.initialize_parallel_optimizer`` does the
data-parallel gradient reduction and clipping, as in NxD. Ranks either already run in a process
group (torchrun, or any launcher: :class:`ProcessGroupEnvironment` is used) or Lightning starts
them with its own launcher (``Trainer(devices=N)`` on CPU uses gloo). Every rank saves and loads
its own shards through :class:`NeuronCheckpointIO`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from lightning.fabric.plugins.environments import TorchElasticEnvironment
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities.rank_zero import rank_zero_only

import nxd
from nxd import ConfigError
from nxd.config import check_config
from nxd.parallel import check_divisible
from nxd_core_parallel import parallel_state as ps
from nxd_lightning.checkpoint_io import NeuronCheckpointIO
from nxd_lightning.environment import ProcessGroupEnvironment


class NxDStrategy(DDPStrategy):
    """Lightning strategy that sets up nxd's tensor/pipeline/data parallel groups from ``nxd_config``."""

    strategy_name = "nxd"

    def __init__(
        self,
        nxd_config: dict | None = None,
        tensor_parallel_size: int = 1,
        pipeline_parallel_size: int = 1,
        expert_parallel_size: int = 1,
        context_parallel_size: int = 1,
        debug: bool = False,
        sync_module_states: bool = False,
        checkpoint_io: Any = None,
        save_load_xser: bool = True,
        process_group_backend: str | None = None,
        timeout: timedelta | None = timedelta(minutes=30),
        **kwargs: Any,
    ) -> None:
        if nxd_config is not None:
            nxd_config = check_config(nxd_config)
            tensor_parallel_size, pipeline_parallel_size = nxd_config.tensor_parallel_size, nxd_config.pipeline_parallel_size
        for name, value in (("expert_parallel_size", expert_parallel_size), ("context_parallel_size", context_parallel_size)):
            if value != 1:
                raise ConfigError(f"NxDStrategy: {name}={value} is not supported by nxd yet; use 1")
        environment = ProcessGroupEnvironment() if ProcessGroupEnvironment.detect() else None
        if environment is None and "parallel_devices" not in kwargs and TorchElasticEnvironment.detect():
            # torchrun started the ranks before the process group exists: one device per local rank
            # (NxD's strategy infers this; Lightning's default counts one device and refuses the world size)
            kwargs["parallel_devices"] = [self._device_type()] * int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        super().__init__(
            cluster_environment=environment,
            checkpoint_io=checkpoint_io if checkpoint_io is not None else NeuronCheckpointIO(save_load_xser=save_load_xser),
            process_group_backend=process_group_backend, timeout=timeout, **kwargs,
        )
        self.nxd_config = nxd_config
        self.tensor_parallel_size = int(tensor_parallel_size)
        self.pipeline_parallel_size = int(pipeline_parallel_size)
        self.debug = debug
        self.sync_module_states = sync_module_states

    # ------------------------------------------------------------------ devices and ranks
    @staticmethod
    def _device_type() -> torch.device:
        from nxd_core_parallel.backends import get_device

        return torch.device(get_device().type)

    @property
    def root_device(self) -> torch.device:
        from nxd_core_parallel.backends import get_device

        device = get_device()
        if device.type == "cuda" and device.index is None:
            return torch.device("cuda", self.local_rank)
        return device

    def _get_process_group_backend(self) -> str:
        if self._process_group_backend:
            return self._process_group_backend
        return nxd.get_backend(self.root_device.type).process_group_backend

    def set_world_ranks(self) -> None:
        if isinstance(self.cluster_environment, ProcessGroupEnvironment):
            rank_zero_only.rank = self.global_rank
            from lightning.fabric.utilities.rank_zero import rank_zero_only as fabric_rank_zero_only

            fabric_rank_zero_only.rank = self.global_rank
            return
        super().set_world_ranks()

    def setup_distributed(self) -> None:
        if not dist.is_initialized():
            super().setup_distributed()
        else:
            self.set_world_ranks()
        self._setup_parallel_state()

    def _setup_parallel_state(self) -> None:
        tp, pp = self.tensor_parallel_size, self.pipeline_parallel_size
        if ps.model_parallel_is_initialized():
            have = (ps.get_tensor_model_parallel_size(), ps.get_pipeline_model_parallel_size())
            if have != (tp, pp):
                raise ConfigError(f"NxDStrategy: parallel state is already set up with TP={have[0]}, PP={have[1]} "
                                  f"but nxd_config asks for TP={tp}, PP={pp}")
            return
        try:
            check_divisible(dist.get_world_size(), tensor_parallel_size=tp, pipeline_parallel_size=pp)
        except ValueError as exc:
            raise ConfigError(f"NxDStrategy: {exc}") from None
        if self.nxd_config is not None:
            from nxd.config import initialize_parallel

            initialize_parallel(check_config(self.nxd_config))
        else:
            ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)

    # ------------------------------------------------------------------ NxD's parallel degrees
    @property
    def data_parallel_size(self) -> int:
        return ps.get_data_parallel_size()

    @property
    def data_parallel_rank(self) -> int:
        return ps.get_data_parallel_rank()

    @property
    def tensor_parallel_rank(self) -> int:
        return ps.get_tensor_model_parallel_rank()

    @property
    def pipeline_parallel_rank(self) -> int:
        return ps.get_pipeline_model_parallel_rank()

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        # Samplers shard over data-parallel replicas only: TP/PP ranks of one replica read the same data.
        return {"num_replicas": self.data_parallel_size, "rank": self.data_parallel_rank}

    # ------------------------------------------------------------------ model and optimizers
    def configure_ddp(self) -> None:
        pass  # no DDP wrapper: nxd's optimizer reduces gradients over the data-parallel group

    def model_to_device(self) -> None:
        assert self.model is not None
        self.model.to(self.root_device)

    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        if not isinstance(tensor, torch.Tensor) or not dist.is_initialized():
            return tensor
        out = tensor.clone()
        op = str(reduce_op).lower() if reduce_op is not None else "sum"
        dist.all_reduce(out, op=dist.ReduceOp.MAX if "max" in op else dist.ReduceOp.SUM, group=group)
        if op in ("mean", "avg", "reduceop.avg"):
            out = out / (dist.get_world_size(group) if group is not None else dist.get_world_size())
        return out

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        return True  # optimizers must exist: nxd loads model and optimizer shards in one call

    def _live_model(self) -> torch.nn.Module:
        module = self.lightning_module
        assert module is not None
        inner = getattr(module, "model", None)
        return inner if isinstance(inner, torch.nn.Module) else module

    def _live_optimizer(self) -> Any:
        if len(self.optimizers) > 1:
            raise ConfigError("NxDStrategy checkpoints hold one optimizer; configure_optimizers returned "
                              f"{len(self.optimizers)}")
        return self.optimizers[0] if self.optimizers else None

    def lightning_module_state_dict(self) -> dict[str, Any]:
        return {}  # the model's shards are written by nxd.save_checkpoint (NeuronCheckpointIO)

    def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        return {}  # likewise for the optimizer (every ZeRO-1 rank writes its own shard)

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        # Every rank writes its shards (the base class saves on global rank 0 only).
        self.checkpoint_io.save_checkpoint(
            checkpoint, filepath,
            storage_options={"model": self._live_model(), "optimizer": self._live_optimizer(), **(storage_options or {})},
        )

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        io = self.checkpoint_io
        if isinstance(io, NeuronCheckpointIO):
            return io.load_checkpoint(checkpoint_path, model=self._live_model(), optimizer=self._live_optimizer())
        return io.load_checkpoint(checkpoint_path)

    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        if not checkpoint.get(NeuronCheckpointIO.LOADED_MARK):
            super().load_model_state_dict(checkpoint, strict=strict)

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        if not checkpoint.get(NeuronCheckpointIO.LOADED_MARK):
            super().load_optimizer_state_dict(checkpoint)

    def remove_checkpoint(self, filepath: Any) -> None:
        if self.is_global_zero:
            self.checkpoint_io.remove_checkpoint(filepath)
        self.barrier("remove_checkpoint")

    def teardown(self) -> None:
        from nxd import finalize_checkpoint

        finalize_checkpoint()
        super().teardown()


#: NxD's name for the same strategy.
NeuronXLAStrategy = NxDStrategy
