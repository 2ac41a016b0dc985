"""The save flow: plan this rank's files (a snapshot, no collectives), then agree, write, commit.

``plan_save`` runs on the calling thread and does no I/O and no collectives, so an asynchronous
save only blocks training for the snapshot copy. ``run_save`` (inline for a synchronous save, on
the writer thread over a separate gloo group for an asynchronous one) does everything else:

1. agree on the tag (rank 0's) and gather each rank's tensor metadata;
2. every rank writes its files;
3. the ranks agree that all succeeded, and only then does rank 0 write ``done`` (and ``newest``),
   then apply retention. A failure on any rank means no ``done``: the directory stays an
   incomplete leftover that loads ignore and auto-resume removes; older checkpoints are untouched.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

from nxd_ckpt.checksum import HashingWriter, digest_of, stable_regions
from nxd_ckpt.errors import CheckpointError
from nxd_ckpt.formats import CheckpointFormat, get_format
from nxd_ckpt.layout import (
    CHECKPOINT_MARKER,
    DONE_MARKER,
    done_payload,
    rng_name,
    shard_name,
    write_newest_pointer,
)
from nxd_ckpt.metadata import build_metadata, shardings_of, tensor_entries, write_metadata
from nxd_ckpt.nxd_dcp import nxd_dcp_state, write_dcp
from nxd_ckpt.overwrite import prepare_target, recover_all, swap_in
from nxd_ckpt.retention import apply_retention
from nxd_ckpt.rng import capture_rng_state
from nxd_ckpt.snapshot import SnapshotBuffers, unwrap_model
from nxd_ckpt.staging import Staging
from nxd_ckpt.storage import Storage
from nxd_ckpt.topology import Ranks, Topology

TORCH = "torch"


@dataclass
class SavePlan:
    #: this rank's proposal; rank 0's wins (a timestamp tag differs across ranks)
    tag: str
    topo: Topology
    fmt: str
    #: (path relative to the tag directory, format, object) written by this rank
    files: list[tuple[str, CheckpointFormat, Any]] = field(default_factory=list)
    #: this rank's contribution to metadata.json
    tensors: dict[str, dict] = field(default_factory=dict)
    flags: dict[str, bool] = field(default_factory=dict)
    num_kept: int | None = None
    #: tags this process has saved (or tried to): the only incomplete ones its retention may remove
    own: frozenset[str] = frozenset()
    #: this rank's ZeRO-1 state keyed as NxD's DCP layout (``use_zero1_dcp``), written by every rank with DCP
    optim_dcp: dict[str, Any] | None = None


def is_zero1(optimizer: Any, zero1_flag: bool) -> bool:
    return bool(zero1_flag or getattr(optimizer, "nxd_zero1", False))


def plan_save(tag: str, topo: Topology, *, model: Any, optimizer: Any, scheduler: Any, user_content: Any,
              fmt_name: str, zero1: bool, buffers: SnapshotBuffers, save_rng: bool,
              num_kept: int | None, staging: Staging | None = None, private: bool = True,
              zero1_dcp: bool = False) -> SavePlan:
    """Snapshot what this rank writes into the reused host ``buffers``. ``private=False`` (a
    synchronous save, which writes before returning): reference host tensors, copy only device
    ones. ``staging``: leave the copies of parameters and optimizer state to it. ``zero1_dcp``:
    the optimizer state in NxD's DCP layout (collective over DP here: every rank calls it)."""
    fmt, torch_fmt = get_format(fmt_name), get_format(TORCH)
    plan = SavePlan(tag, topo, fmt.name, num_kept=num_kept)

    def snap(obj: Any, name: str, deferrable: Any = None) -> Any:
        return buffers.snapshot(obj, name, private=private, staging=staging, deferrable=deferrable)

    if model is not None:
        module = unwrap_model(model)
        state = module.state_dict() if hasattr(module, "state_dict") else dict(module)
        if topo.writes_replica:
            # parameters change only in an optimizer step; other entries (buffers) may change in a forward
            params = {p.data_ptr() for p in module.parameters()} if hasattr(module, "parameters") else set()
            data = snap(state, "model", lambda t: t.data_ptr() in params)
            plan.files.append((f"model/{shard_name(0, topo.tp_rank, topo.pp_rank, fmt.suffix)}", fmt, data))
            plan.tensors = tensor_entries(data, shardings_of(module, state), topo)
    if optimizer is not None and zero1_dcp:
        plan.optim_dcp = _nxd_dcp_optim(model, optimizer, topo, tag)
    elif optimizer is not None:
        # every rank asks, as for the model: an optimizer's state_dict() may be collective (nxd-core-parallel's
        # gathers expert-parallel state over the EP group); building one references tensors, copies nothing
        optim_state = optimizer.state_dict()
        if topo.cp_rank == 0 and (zero1 or topo.dp_rank == 0):
            plan.files.append((f"optim/{shard_name(topo.dp_rank if zero1 else 0, topo.tp_rank, topo.pp_rank)}",
                               torch_fmt, snap(optim_state, "optim", lambda _: True)))
    if topo.rank == 0:
        if scheduler is not None:
            plan.files.append(("scheduler.pt", torch_fmt, snap(scheduler.state_dict(), "scheduler")))
        if user_content is not None:
            plan.files.append(("user_content.pt", torch_fmt, snap(user_content, "user_content")))
    if save_rng:
        plan.files.append((rng_name(topo.rank), torch_fmt, capture_rng_state()))
    buffers.done()
    plan.flags = dict(zero1=zero1, has_model=model is not None, has_optimizer=optimizer is not None,
                      has_scheduler=scheduler is not None, has_user_content=user_content is not None,
                      has_rng=save_rng)
    return plan


def _nxd_dcp_optim(model: Any, optimizer: Any, topo: Topology, tag: str) -> dict[str, Any]:
    """This rank's ZeRO-1 state whole over DP (a copy), keyed as NxD's DCP layout keys it (DP and CP
    ranks hand DCP the same tensors: it writes each once)."""
    where = f"checkpoint {tag}: use_zero1_dcp=True"
    if not callable(getattr(optimizer, "xla_state_dict", None)):
        raise CheckpointError(f"{where} writes NxD's ZeRO-1 layout and needs a ZeRO-1 optimizer (nxd-zero1: "
                              "optimizer_config.zero_one_enabled=True); got " + type(optimizer).__name__)
    if model is None:
        raise CheckpointError(f"{where}: NxD's DCP optimizer state is keyed by parameter name: pass the model too")
    names_of = {id(p): n for n, p in unwrap_model(model).named_parameters()}
    names = [names_of.get(id(p), "?") for g in optimizer.param_groups for p in g["params"]]
    if "?" in names:
        raise CheckpointError(f"{where}: the optimizer holds parameters the model does not (NxD keys their state by "
                              "the model's parameter names)")
    return nxd_dcp_state(optimizer.xla_state_dict(whole=True), names, topo.tp, topo.tp_rank, topo.pp, topo.pp_rank,
                         where)


def _write_optim_dcp(storage: Storage, target: str, plan: SavePlan, ranks: Ranks) -> tuple[str | None, dict[str, dict]]:
    """Every rank writes its part of NxD's DCP optimizer layout (collective; DCP agrees on a failure
    itself); rank 0 then records the checksum of every file DCP wrote."""
    assert plan.optim_dcp is not None
    where = storage.describe(f"{target}/optim")
    try:
        files = write_dcp(storage, f"{target}/optim", plan.optim_dcp, ranks.group)
        sums = {}
        if plan.topo.rank == 0:
            for name in files:
                with storage.open_read(f"{target}/optim/{name}") as f:
                    sums[f"optim/{name}"] = digest_of(f.read())
        return None, sums
    except Exception as exc:  # noqa: BLE001 - reported to every rank by commit()
        return f"rank {plan.topo.rank}: writing {where} (NxD's DCP layout) failed: {type(exc).__name__}: {exc}", {}


def run_save(storage: Storage, plan: SavePlan, ranks: Ranks) -> str:
    """Agree, write and commit (collective over ``ranks``, the group the save started with);
    returns the tag saved. Every agreement needs all ``plan.topo.world`` ranks: if the group went
    away (a rank died and the loop tore it down) the save raises and is never committed."""
    rank = plan.topo.rank
    if ranks.world != plan.topo.world:
        raise CheckpointError(f"checkpoint {storage.describe(plan.tag)}: the save was planned for {plan.topo.world} "
                              f"ranks but its process group has {ranks.world}")
    target, failure = plan.tag, None
    if rank == 0:  # before the agreement, so no rank writes before the target is ready
        try:
            target = prepare_target(storage, plan.tag)
        except Exception as exc:  # noqa: BLE001 - every rank raises it after the agreement
            failure = f"rank 0: preparing {storage.describe(plan.tag)} failed: {type(exc).__name__}: {exc}"
    gathered = ranks.all_gather((plan.tag, target, failure, plan.tensors), f"checkpoint {storage.describe(plan.tag)}")
    tag, target, failure = gathered[0][:3]
    if failure:
        raise CheckpointError(f"checkpoint {storage.describe(tag)} was not saved: {failure}")
    metadata = None
    if rank == 0:
        merged: dict[str, dict] = {}
        for *_, part in gathered:
            merged.update(part)
        metadata = build_metadata(tag, plan.topo, plan.fmt, merged, **plan.flags)
    error, sums = write_files(storage, target, plan)
    if plan.optim_dcp is not None:  # every rank takes part, even after its own error (DCP is collective)
        dcp_error, dcp_sums = _write_optim_dcp(storage, target, plan, ranks)
        error, sums = error or dcp_error, {**sums, **dcp_sums}
    commit(storage, tag, target, plan, error, sums, metadata, ranks)
    return tag


def write_files(storage: Storage, tag: str, plan: SavePlan) -> tuple[str | None, dict[str, dict]]:
    """Write this rank's files into directory ``tag``, hashing the bytes as they stream out;
    return an error description instead of raising (for agreement) and each file's digest. The
    objects' tensors hold still until their file's digest is taken (this call holds them; a
    snapshot's buffers are not reused before its save ends), so they are hashed while the file
    is synced."""
    rank = plan.topo.rank
    sums: dict[str, dict] = {}
    path = CHECKPOINT_MARKER  # the file being written: a full disk's error names no file of its own
    try:
        if rank == 0:
            with storage.open_write(f"{tag}/{CHECKPOINT_MARKER}") as f:
                f.write(b"1")
        for path, fmt, obj in plan.files:
            with storage.open_write(f"{tag}/{path}") as f:
                out = HashingWriter(f, stable=stable_regions(obj))
                try:
                    fmt.dump(obj, out)
                except Exception as exc:
                    if out.error is not None and out.error is not exc:  # torch.save hides it as "unexpected pos"
                        raise out.error from exc
                    raise
                out.hash_in_background()  # while the file is flushed and synced
            sums[path] = out.digest()
    except Exception as exc:  # noqa: BLE001 - reported to every rank by commit()
        return f"rank {rank}: writing {storage.describe(f'{tag}/{path}')} failed: {type(exc).__name__}: {exc}", sums
    return None, sums


def commit(storage: Storage, tag: str, target: str, plan: SavePlan, error: str | None, sums: dict[str, dict],
           metadata: dict | None, ranks: Ranks) -> None:
    """Agree across all ranks; rank 0 writes the metadata (with every file's checksum), marks
    ``target`` complete (``done`` holds the metadata's checksum), swaps it in for ``tag`` when it
    is a temporary (an overwrite), and applies retention. Without every rank's word, no commit."""
    what = f"committing checkpoint {storage.describe(tag)}"
    answers = ranks.all_gather((plan.topo.rank, error, sums), what)
    if sorted(r for r, *_ in answers) != list(range(plan.topo.world)):  # never fewer voices than writers
        raise CheckpointError(f"{what}: expected the word of ranks 0..{plan.topo.world - 1}, got "
                              f"{sorted(r for r, *_ in answers)}; not committed")
    errors = [e for _, e, _ in answers if e]
    if errors:
        raise CheckpointError(
            f"checkpoint {storage.describe(tag)} was not saved (no 'done' marker written; earlier "
            f"checkpoints, including an earlier save of this tag, are untouched): " + "; ".join(errors)
        )
    failure = None
    if plan.topo.rank == 0:
        try:
            assert metadata is not None
            metadata["files"] = dict(sorted((p, d) for *_, part in answers for p, d in part.items()))
            meta_digest = write_metadata(storage, target, metadata)
            with storage.open_write(f"{target}/{DONE_MARKER}") as f:
                f.write(done_payload(meta_digest))
        except Exception as exc:  # noqa: BLE001 - every rank raises it after the last agreement
            failure = f"could not mark {storage.describe(target)} complete: {type(exc).__name__}: {exc}"
        else:
            if target != tag:
                try:
                    swap_in(storage, tag, target)
                except Exception as exc:  # noqa: BLE001 - committed: the next load/save finishes the swap
                    failure = (f"{storage.describe(target)} is complete but could not replace {storage.describe(tag)} "
                               f"({type(exc).__name__}: {exc}); the next load or save of this directory finishes it")
            write_newest_pointer(storage, tag)  # removed, with a warning, when it cannot be written
            if plan.num_kept is not None and failure is None:
                try:
                    recover_all(storage)  # leftovers of crashed overwrites, before counting what to keep
                    apply_retention(storage, plan.num_kept, keep=tag, own=plan.own | {tag})
                except Exception as exc:  # noqa: BLE001 - the new checkpoint is safe; never hang the other ranks
                    warnings.warn(f"retention in {storage.describe('')} failed: {exc}", stacklevel=2)
    # nobody returns before 'done' exists, and everyone learns if it could not be written
    failure = ranks.all_gather(failure, what)[0]
    if failure:
        raise CheckpointError(failure)
