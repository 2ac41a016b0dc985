"""The ``default`` checkpointer behind ``nxd.save_checkpoint`` / ``load_checkpoint``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

import nxd.trainer
from nxd.parallel import ParallelContext, process_group_timeout
from nxd_ckpt.errors import CheckpointError
from nxd_ckpt.layout import DONE_MARKER, checkpoint_dir, newest_complete_tag, read_done, tag_inside, validate_tag
from nxd_ckpt.load import Reader, load_model, load_optimizer, restore_rng
from nxd_ckpt.metadata import read_metadata
from nxd_ckpt.nxd_layouts import is_nxd_written
from nxd_ckpt.overwrite import recover_all
from nxd_ckpt.retention import remove_incomplete
from nxd_ckpt.save import is_zero1, plan_save, run_save
from nxd_ckpt.snapshot import SnapshotBuffers
from nxd_ckpt.staging import Staging
from nxd_ckpt.storage import open_storage
from nxd_ckpt.topology import Ranks, topology_of
from nxd_ckpt.verify import is_whole_unmarked, warn_unmarked
from nxd_ckpt.writer import AsyncWriter


class Checkpointer:
    """Sharded save/load with NxD's layout. One instance per process (registered as ``default``).
    ``save``/``load``/``has_checkpoint`` take the parallel context explicitly (``context``, which the
    core's ``nxd.save_checkpoint`` & co. pass): it says which shards this rank writes and reads."""

    def __init__(self) -> None:
        self._writer = AsyncWriter()
        self._side_group: Any = None
        self._buffers = SnapshotBuffers()
        self._staging: Staging | None = None  # an overlapped snapshot whose step guard is armed
        self._own: set[str] = set()  # tags this process saved or tried to (see retention)

    # ------------------------------------------------------------------ save
    def save(
        self, path: str, tag: str = "", *, context: ParallelContext | None, model: Any = None, optimizer: Any = None,
        scheduler: Any = None, user_content: Any = None, use_xser: bool = False, num_kept_ckpts: int | None = None,
        async_save: bool = False, zero1_optimizer: bool = False, format: str | None = None,
        storage_options: dict | None = None, save_rng: bool = True, overlap_snapshot: bool = False,
        on_snapshot_wait: Callable[[float], None] | None = None, use_zero1_dcp: bool = False, **unused: Any,
    ) -> None:
        """Save ``path/tag`` (NxD's positional signature is ``nxd.save_checkpoint``'s, written there
        once; the component takes keywords). ``use_xser=True`` selects the safetensors format (one
        addressable record per tensor, like NxD's xser) unless ``format`` names one. NxD's
        ``num_workers`` is accepted and unused: each rank writes its own files.

        ``overlap_snapshot=True`` (with ``async_save``): return before copying parameters and
        optimizer state; the next optimizer step waits for that copy (see ``nxd_ckpt.staging``),
        reporting the seconds it waited to ``on_snapshot_wait``. Only for loops that change
        parameters through optimizer steps alone.

        ``use_zero1_dcp=True`` (NxD's option): the ZeRO-1 optimizer state goes into ``optim/`` in
        NxD's torch.distributed.checkpoint layout (``nxd_ckpt.nxd_dcp``), which NxD's
        ``load_checkpoint`` reads; local paths only."""
        self._wait_writer()  # at most one save in flight; raises the previous one's failure
        if num_kept_ckpts is not None and (not isinstance(num_kept_ckpts, int) or num_kept_ckpts < 1):
            raise ValueError(f"num_kept_ckpts must be a positive integer or None, got {num_kept_ckpts!r}")
        # Only the snapshot happens here: the tag/metadata agreement and all file I/O happen in
        # run_save, which for an async save runs on the writer thread.
        topo = topology_of(context)
        tag = validate_tag(tag or time.strftime("ckpt_%Y%m%d_%H%M%S"))  # rank 0's wins in run_save
        storage = open_storage(path, storage_options)
        fmt = format or ("safetensors" if use_xser else "torch")
        if overlap_snapshot and not async_save:
            raise ValueError("overlap_snapshot=True needs async_save=True (a synchronous save writes before returning)")
        staging = Staging(on_snapshot_wait) if overlap_snapshot else None
        plan = plan_save(tag, topo, model=model, optimizer=optimizer, scheduler=scheduler, user_content=user_content,
                         fmt_name=fmt, zero1=is_zero1(optimizer, zero1_optimizer),
                         buffers=self._buffers, save_rng=save_rng, num_kept=num_kept_ckpts,
                         staging=staging, private=async_save, zero1_dcp=use_zero1_dcp)
        plan.own = frozenset(self._own)
        self._own.add(tag)
        if not async_save:
            saved_tag = run_save(storage, plan, Ranks.current())
            # Plugins' own exports (e.g. nxd-lora's adapter) go next to the committed checkpoint.
            # Async saves skip this: the model keeps changing while the writer runs.
            nxd.trainer.checkpoint_extras(model, path, saved_tag, "saved", context)
            return
        # the group is fixed now, on the training thread: the writer's agreements need all its ranks
        ranks = Ranks.current(self._async_group())
        if staging is not None:
            staging.start()
            self._staging = staging

        def write() -> None:
            if staging is not None:
                staging.copy_on_writer()
            run_save(storage, plan, ranks)

        self._writer.submit(write, storage.describe(tag))

    def _wait_writer(self) -> None:
        """Wait for the in-flight save (raising its error); an overlapped snapshot's step guard goes with it."""
        try:
            self._writer.wait()
        finally:
            if self._staging is not None:
                self._staging.wait_before_step()
                self._staging = None

    def _async_group(self) -> Any:
        """A separate gloo group so the writer thread's agreement never interleaves with the
        training thread's collectives on the default group (made afresh if the job destroyed and
        re-created its process groups since the last save)."""
        if not (dist.is_available() and dist.is_initialized()):
            return None
        if self._side_group is not None:
            try:
                dist.get_process_group_ranks(self._side_group)
            except (KeyError, ValueError, RuntimeError):  # destroyed with the default group
                self._side_group = None
        if self._side_group is None:
            self._side_group = dist.new_group(backend="gloo", timeout=process_group_timeout())
        return self._side_group

    # ------------------------------------------------------------------ load
    def load(
        self, path: str, tag: str | None = None, *, context: ParallelContext | None, model: Any = None,
        optimizer: Any = None, scheduler: Any = None, strict: bool = True, storage_options: dict | None = None,
        load_rng: bool = True, **unused: Any,
    ) -> Any:
        """Load ``path/tag`` (``tag=None``: newest complete, after removing interrupted saves) and
        return its user content."""
        self._wait_writer()
        topo = topology_of(context)
        storage = open_storage(path, storage_options)
        if tag is None:
            if topo.rank == 0:  # auto-resume: finish or drop interrupted overwrites, drop partial saves
                recover_all(storage)
                remove_incomplete(storage)
            Ranks.current().barrier(f"resuming from {storage.describe('')}")
            tag = newest_complete_tag(storage)
            if tag is None:
                raise CheckpointError(f"{storage.describe('')}: no complete checkpoint (no tag has a 'done' marker)")
        else:
            tag_inside(storage, tag)
        where = checkpoint_dir(storage, tag)
        if where is None and is_nxd_written(storage, tag):
            where = tag  # NxD's converter writes no 'done'; a tag named explicitly is read as written
        if where is None:
            what = "does not exist" if not storage.exists(tag) else (
                "is incomplete (no 'done' marker: the save was interrupted)" + (
                    f"; every file is there: `nxd ckpt verify {storage.describe('')} --tag {tag} --mark-done` checks "
                    "their checksums and marks it complete" if is_whole_unmarked(storage, tag) else ""))
            raise CheckpointError(f"checkpoint {storage.describe(tag)} {what}")
        done = read_done(storage, where) if storage.exists(f"{where}/{DONE_MARKER}") else {}
        meta = read_metadata(storage, where, done.get("metadata"))
        if meta is None and storage.list_files(f"{where}/rng"):
            raise CheckpointError(f"{storage.describe(f'{where}/metadata.json')}: missing, but the checkpoint was "
                                  "written by nxd-ckpt (it has rng/ states); without it the RNG states cannot be "
                                  "restored (pass load_rng=False to load without them)")
        reader = Reader(storage, where, meta)
        if model is not None:
            load_model(reader, meta, model, topo, strict)
            reader.drop()
        if optimizer is not None:
            load_optimizer(reader, meta, optimizer, topo, model)
            reader.drop()
        if scheduler is not None:
            scheduler.load_state_dict(reader.load("scheduler.pt"))
        saved_content = meta.get("has_user_content") if meta is not None else reader.has("user_content.pt")
        user_content = reader.load("user_content.pt") if saved_content else None
        if load_rng:
            restore_rng(reader, meta, topo)
        nxd.trainer.checkpoint_extras(model, path, tag, "loaded", context)
        return user_content

    def has_checkpoint(self, path: str, storage_options: dict | None = None, *,
                       context: ParallelContext | None = None) -> bool:
        storage = open_storage(path, storage_options)
        if topology_of(context).rank == 0:
            warn_unmarked(storage)
        return newest_complete_tag(storage) is not None

    def finalize(self) -> None:
        """Wait for the in-flight save (raising its error) and free the snapshot buffers."""
        try:
            self._wait_writer()
        finally:
            self._buffers.release()

