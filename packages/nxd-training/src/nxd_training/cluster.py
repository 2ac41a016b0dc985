"""Where the nodes of a multi-node run meet: the ``launcher`` section, or the environment of the
scheduler ``nxd train`` runs inside.

* SLURM (``srun --ntasks-per-node=1 nxd train cfg.yaml`` in a batch script): the first host of
  ``SLURM_JOB_NODELIST`` hosts the c10d rendezvous, ``SLURM_NODEID`` is the node rank,
  ``SLURM_NNODES`` the node count and ``SLURM_JOB_ID`` the rendezvous id.
* torchrun-style environments (Kubernetes PyTorchJob, and any launcher that exports them):
  ``PET_NNODES``/``PET_NODE_RANK``/``PET_MASTER_ADDR``/``PET_MASTER_PORT`` (what the Kubeflow
  training operator sets for torchrun), else ``MASTER_ADDR``/``MASTER_PORT`` with the node count and
  index in ``NNODES``/``NODE_RANK`` or, one pod per node, ``WORLD_SIZE``/``RANK``.

The rendezvous port is ``NXD_RDZV_PORT``, else ``MASTER_PORT``, else torchrun's c10d default 29400.
Keys the user set in ``launcher`` always win over the environment.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from nxd.errors import ConfigError
from nxd_training.config.schema import TrainingConfig

DEFAULT_RDZV_PORT = 29400  # torchrun's default for the c10d rendezvous backend


@dataclass(frozen=True)
class ClusterEnv:
    """What the scheduler's environment says about this node's place in the job."""

    scheduler: str  # "slurm" | "torchrun"
    num_nodes: int
    node_rank: int
    rdzv_endpoint: str
    rdzv_id: str
    nodes_from: str  # the variable the node count came from, for messages


def expand_hostlist(spec: str) -> list[str]:
    """SLURM's compressed host list, e.g. ``gpu[001-003,7],login1`` -> gpu001 gpu002 gpu003 gpu7 login1."""
    hosts: list[str] = []
    for prefix, ranges, suffix in re.findall(r"([^,\[]*)(?:\[([^\]]*)\])?([^,\[]*)(?:,|$)", spec.strip()):
        if not (prefix or ranges or suffix):
            continue
        if not ranges:
            hosts.append(prefix + suffix)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            if not high:
                hosts.append(f"{prefix}{low}{suffix}")
                continue
            if not (low.isdigit() and high.isdigit()) or int(high) < int(low):
                raise ConfigError(f"SLURM_JOB_NODELIST={spec!r}: cannot read the range {part!r}")
            hosts += [f"{prefix}{i:0{len(low)}d}{suffix}" for i in range(int(low), int(high) + 1)]
    return hosts


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise ConfigError(f"environment variable {name}={env[name]!r} is not an integer") from None


def _port(env: Mapping[str, str]) -> int:
    for name in ("NXD_RDZV_PORT", "MASTER_PORT"):
        if env.get(name):
            return _int(env, name)
    return DEFAULT_RDZV_PORT


def _slurm(env: Mapping[str, str]) -> ClusterEnv:
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    hosts = expand_hostlist(nodelist)
    if not hosts:
        raise ConfigError("running under SLURM (SLURM_JOB_ID is set) but SLURM_JOB_NODELIST is empty")
    count_var = "SLURM_NNODES" if "SLURM_NNODES" in env else "SLURM_JOB_NUM_NODES"
    num_nodes = _int(env, count_var) if count_var in env else len(hosts)
    if num_nodes > 1 and "SLURM_STEP_ID" not in env:
        raise ConfigError(
            f"this SLURM job has {num_nodes} nodes but nxd train runs in the batch script, on the first node only: "
            "start it on every node with `srun --ntasks-per-node=1 nxd train ...` (see docs/cluster.md)"
        )
    tasks = env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0]
    if "SLURM_STEP_ID" in env and tasks not in ("", "1"):
        raise ConfigError(
            f"SLURM_NTASKS_PER_NODE={tasks}: run one nxd train per node (srun --ntasks-per-node=1); it starts "
            "trainer.devices ranks on its node itself"
        )
    return ClusterEnv("slurm", num_nodes, _int(env, "SLURM_NODEID") if "SLURM_NODEID" in env else 0,
                      f"{hosts[0]}:{_port(env)}", f"slurm-{env['SLURM_JOB_ID']}", count_var)


def _torchrun(env: Mapping[str, str]) -> ClusterEnv | None:
    for nodes, rank, addr, port in (("PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"),
                                    ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT"),
                                    ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")):
        if nodes in env and addr in env:
            count = env[nodes].split(":")[-1]  # PET_NNODES may be an elastic range "1:4"
            if not count.isdigit():
                raise ConfigError(f"environment variable {nodes}={env[nodes]!r} is not a node count")
            port_value = env.get("NXD_RDZV_PORT") or env.get(port) or str(DEFAULT_RDZV_PORT)
            endpoint = f"{env[addr]}:{port_value}"
            return ClusterEnv("torchrun", int(count), _int(env, rank) if rank in env else 0, endpoint,
                              f"nxd-{endpoint}", nodes)
    return None


def detect_cluster(env: Mapping[str, str] | None = None) -> ClusterEnv | None:
    """The scheduler's view of this node, or ``None`` outside a scheduler (or inside a rank that
    torchrun already started: ``LOCAL_RANK`` is set there and nothing is to be launched)."""
    env = os.environ if env is None else env
    if "LOCAL_RANK" in env or "TORCHELASTIC_RUN_ID" in env:
        return None
    if "SLURM_JOB_ID" in env:
        return _slurm(env)
    return _torchrun(env)


def apply_cluster(config: TrainingConfig, env: Mapping[str, str] | None = None) -> tuple[TrainingConfig, str]:
    """``config`` with the launcher keys the scheduler implies filled in (the user's own values
    win), and a line describing what was taken from the environment ("" when nothing)."""
    cluster = detect_cluster(env)
    if cluster is None or (cluster.num_nodes == 1 and config.trainer.num_nodes == 1):
        return config, ""
    tr, lc = config.trainer, config.launcher
    if tr.num_nodes != cluster.num_nodes:
        raise ConfigError(
            f"trainer.num_nodes={tr.num_nodes} but the {cluster.scheduler} job has {cluster.num_nodes} nodes "
            f"({cluster.nodes_from}); pass trainer.num_nodes={cluster.num_nodes}, or run on {tr.num_nodes} nodes"
        )
    if not 0 <= cluster.node_rank < cluster.num_nodes:
        raise ConfigError(f"the {cluster.scheduler} environment gives node rank {cluster.node_rank}, outside "
                          f"0..{cluster.num_nodes - 1}")
    filled = config.model_copy(deep=True)
    flc = filled.launcher
    flc.rdzv_endpoint = lc.rdzv_endpoint or cluster.rdzv_endpoint
    flc.node_rank = cluster.node_rank if lc.node_rank is None else lc.node_rank
    flc.rdzv_id = lc.rdzv_id or cluster.rdzv_id
    return filled, (f"{cluster.scheduler}: node {flc.node_rank} of {cluster.num_nodes}, rendezvous at "
                    f"{flc.rdzv_endpoint} (id {flc.rdzv_id})")
