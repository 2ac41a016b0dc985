"""The save flow: plan this rank's files, snapshot them, write them, then commit.

Commit protocol: every rank writes its files, the ranks agree that all succeeded, and only then
does rank 0 write ``done`` (and the ``newest`` pointer), then apply retention. A failure on any
rank means no ``done``: the directory stays an incomplete leftover that loads ignore and
auto-resume removes; older checkpoints are never touched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nxd_ckpt.errors import CheckpointError
from nxd_ckpt.formats import CheckpointFormat, get_format
from nxd_ckpt.layout import CHECKPOINT_MARKER, DONE_MARKER, NEWEST_POINTER, done_payload, rng_name, shard_name
from nxd_ckpt.metadata import build_metadata, shardings_of, tensor_entries, write_metadata
from nxd_ckpt.retention import apply_retention
from nxd_ckpt.rng import capture_rng_state
from nxd_ckpt.snapshot import to_cpu, unwrap_model
from nxd_ckpt.storage import Storage
from nxd_ckpt.topology import Topology, all_gather_objects

TORCH = "torch"


@dataclass
class SavePlan:
    tag: str
    #: (relative path, format, object) written by this rank
    files: list[tuple[str, CheckpointFormat, Any]] = field(default_factory=list)
    metadata: dict[str, Any] | None = None  # rank 0 only
    num_kept: int | None = None


def is_zero1(optimizer: Any, zero1_flag: bool) -> bool:
    return bool(zero1_flag or getattr(optimizer, "nxd_zero1", False))


def plan_save(tag: str, topo: Topology, *, model: Any, optimizer: Any, scheduler: Any, user_content: Any,
              fmt_name: str, zero1: bool, clone: bool, save_rng: bool, num_kept: int | None) -> SavePlan:
    """Snapshot what this rank writes (collective: every rank must call it)."""
    fmt, torch_fmt = get_format(fmt_name), get_format(TORCH)
    plan = SavePlan(tag, num_kept=num_kept)
    tensors: dict[str, dict] = {}
    if model is not None:
        module = unwrap_model(model)
        state = module.state_dict() if hasattr(module, "state_dict") else dict(module)
        if topo.dp_rank == 0:
            # safetensors refuses tied (shared-storage) tensors, so its snapshot always copies
            snap = to_cpu(state, clone or not fmt.nested)
            plan.files.append((f"{tag}/model/{shard_name(0, topo.tp_rank, topo.pp_rank, fmt.suffix)}", fmt, snap))
            tensors = tensor_entries(snap, shardings_of(module), topo)
    if optimizer is not None and (zero1 or topo.dp_rank == 0):
        plan.files.append((f"{tag}/optim/{shard_name(topo.dp_rank if zero1 else 0, topo.tp_rank, topo.pp_rank)}",
                           torch_fmt, to_cpu(optimizer.state_dict(), clone)))
    if topo.rank == 0:
        if scheduler is not None:
            plan.files.append((f"{tag}/scheduler.pt", torch_fmt, to_cpu(scheduler.state_dict(), clone)))
        if user_content is not None:
            plan.files.append((f"{tag}/user_content.pt", torch_fmt, to_cpu(user_content, clone)))
    if save_rng:
        plan.files.append((f"{tag}/{rng_name(topo.rank)}", torch_fmt, capture_rng_state()))
    gathered = all_gather_objects(tensors)
    if topo.rank == 0:
        merged: dict[str, dict] = {}
        for part in gathered:
            merged.update(part)
        plan.metadata = build_metadata(
            tag, topo, fmt.name, merged, zero1=zero1, has_model=model is not None,
            has_optimizer=optimizer is not None, has_scheduler=scheduler is not None,
            has_user_content=user_content is not None, has_rng=save_rng,
        )
    return plan


def write_files(storage: Storage, plan: SavePlan, rank: int) -> str | None:
    """Write this rank's files; return an error description instead of raising (for agreement)."""
    try:
        if rank == 0:
            with storage.open_write(f"{plan.tag}/{CHECKPOINT_MARKER}") as f:
                f.write(b"1")
        for path, fmt, obj in plan.files:
            with storage.open_write(path) as f:
                fmt.dump(obj, f)
        if plan.metadata is not None:
            write_metadata(storage, plan.tag, plan.metadata)
    except Exception as exc:  # noqa: BLE001 - reported to every rank by commit()
        return f"rank {rank}: writing {storage.describe(plan.tag)} failed: {type(exc).__name__}: {exc}"
    return None


def commit(storage: Storage, plan: SavePlan, rank: int, error: str | None, group: Any = None) -> None:
    """Agree across ranks; rank 0 marks the checkpoint complete and applies retention."""
    errors = [e for e in all_gather_objects(error, group) if e]
    if errors:
        raise CheckpointError(
            f"checkpoint {storage.describe(plan.tag)} was not saved (no 'done' marker written; earlier "
            f"checkpoints are untouched): " + "; ".join(errors)
        )
    if rank == 0:
        try:
            with storage.open_write(f"{plan.tag}/{DONE_MARKER}") as f:
                f.write(done_payload())
        except Exception as exc:  # noqa: BLE001
            raise CheckpointError(f"could not mark {storage.describe(plan.tag)} complete: {exc}") from exc
        try:
            with storage.open_write(NEWEST_POINTER) as f:
                f.write(plan.tag.encode())
        except Exception:  # noqa: BLE001 - a convenience pointer; 'done' markers are authoritative
            pass
        if plan.num_kept is not None:
            apply_retention(storage, plan.num_kept, keep=plan.tag)
    all_gather_objects(None, group)  # nobody returns before 'done' exists
