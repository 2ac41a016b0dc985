"""Multi-node runs: the scheduler's environment (SLURM, torchrun-style / Kubernetes PyTorchJob)
fills the launcher keys, and two `nxd train` launchers on loopback, as two "nodes" of one process
each, train with the per-step losses of one node with two processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fault_hooks import rank1_dies_env

from nxd.errors import ConfigError
from nxd_training.cluster import DEFAULT_RDZV_PORT, apply_cluster, detect_cluster, expand_hostlist
from nxd_training.config.loader import load_config
from nxd_training.exp_manager import read_metrics

SLURM = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "trn1-[007-008]", "SLURM_NNODES": "2",
         "SLURM_NODEID": "1", "SLURM_STEP_ID": "0", "SLURM_NTASKS_PER_NODE": "1"}


def test_expand_hostlist() -> None:
    assert expand_hostlist("gpu[001-003,7],login1") == ["gpu001", "gpu002", "gpu003", "gpu7", "login1"]
    assert expand_hostlist("a1,b[2-3]-ib") == ["a1", "b2-ib", "b3-ib"]
    assert expand_hostlist("single") == ["single"]
    with pytest.raises(ConfigError, match="cannot read the range"):
        expand_hostlist("n[5-2]")


def test_slurm_environment() -> None:
    cluster = detect_cluster(SLURM)
    assert (cluster.scheduler, cluster.num_nodes, cluster.node_rank) == ("slurm", 2, 1)
    assert cluster.rdzv_endpoint == f"trn1-007:{DEFAULT_RDZV_PORT}" and cluster.rdzv_id == "slurm-4242"
    assert detect_cluster({**SLURM, "NXD_RDZV_PORT": "31000"}).rdzv_endpoint == "trn1-007:31000"
    with pytest.raises(ConfigError, match="srun --ntasks-per-node=1"):
        detect_cluster({k: v for k, v in SLURM.items() if k != "SLURM_STEP_ID"})  # the batch script itself
    with pytest.raises(ConfigError, match="run one nxd train per node"):
        detect_cluster({**SLURM, "SLURM_NTASKS_PER_NODE": "32"})
    assert detect_cluster({**SLURM, "LOCAL_RANK": "0"}) is None  # inside a rank torchrun started


def test_torchrun_style_environments() -> None:
    pet = {"PET_NNODES": "4", "PET_NODE_RANK": "3", "PET_MASTER_ADDR": "job-master-0", "PET_MASTER_PORT": "23456"}
    cluster = detect_cluster(pet)
    assert (cluster.scheduler, cluster.num_nodes, cluster.node_rank, cluster.rdzv_endpoint) == (
        "torchrun", 4, 3, "job-master-0:23456")
    pods = {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "23456"}
    assert (detect_cluster(pods).num_nodes, detect_cluster(pods).node_rank) == (2, 1)
    assert detect_cluster({"PATH": "/bin"}) is None


def _config(tmp_path: Path, make_config, **sections):
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(make_config(**sections)))
    return load_config(path, [], check=False)


def test_apply_cluster_fills_launcher_and_refuses_mismatches(make_config, tmp_path: Path) -> None:
    config = _config(tmp_path, make_config, trainer={"devices": 1, "num_nodes": 2})
    filled, note = apply_cluster(config, SLURM)
    assert (filled.launcher.rdzv_endpoint, filled.launcher.node_rank, filled.launcher.rdzv_id) == (
        f"trn1-007:{DEFAULT_RDZV_PORT}", 1, "slurm-4242")
    assert "slurm: node 1 of 2" in note and config.launcher.rdzv_endpoint is None  # the input is not changed
    mine = _config(tmp_path, make_config, trainer={"devices": 1, "num_nodes": 2},
                   launcher={"rdzv_endpoint": "head:1234", "node_rank": 0})
    assert apply_cluster(mine, SLURM)[0].launcher.rdzv_endpoint == "head:1234"  # the user's keys win
    wrong = _config(tmp_path, make_config, trainer={"devices": 1, "num_nodes": 4})
    with pytest.raises(ConfigError, match=r"trainer.num_nodes=4 but the slurm job has 2 nodes \(SLURM_NNODES\)"):
        apply_cluster(wrong, SLURM)
    single = _config(tmp_path, make_config)
    assert apply_cluster(single, {**SLURM, "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "n1"}) == (single, "")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _nxd_train(config_path: Path, env: dict[str, str], *overrides: str) -> subprocess.Popen:
    code = "import sys; from nxd.cli import main; sys.exit(main())"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PET_", "MASTER_", "NXD_RDZV"))}
    return subprocess.Popen([sys.executable, "-c", code, "train", str(config_path), *overrides],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**clean, "OMP_NUM_THREADS": "1", **env})


def _wait_nodes(nodes: list[subprocess.Popen], timeout: float, grace: float) -> list[str]:
    """Every node's output once all exited; fails fast with every node's output when one fails (the
    others then get ``grace`` seconds: their rendezvous/collective bounds) or ``timeout`` passes."""
    import threading
    import time

    outs: list[list[str]] = [[] for _ in nodes]
    readers = [threading.Thread(target=lambda n=n, o=o: o.append(n.stdout.read()), daemon=True)
               for n, o in zip(nodes, outs)]
    for r in readers:
        r.start()
    deadline, failed_at = time.monotonic() + timeout, None
    while any(n.poll() is None for n in nodes) and time.monotonic() < deadline:
        if failed_at is None and any(n.poll() not in (None, 0) for n in nodes):
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > grace:
            break
        time.sleep(0.2)
    hung = [i for i, n in enumerate(nodes) if n.poll() is None]
    for i in hung:
        nodes[i].kill()
    for n, r in zip(nodes, readers):
        n.wait()
        r.join(10)
    text = ["".join(o) for o in outs]
    report = "\n".join(f"--- node {i} (exit {n.returncode}) ---\n{t[-6000:]}" for i, (n, t) in enumerate(zip(nodes, text)))
    assert not hung and all(n.returncode == 0 for n in nodes), f"nodes {hung} still running when stopped\n{report}"
    return text


def _losses(log_dir: Path) -> list[float]:
    return [r["loss"] for r in read_metrics(log_dir) if "loss" in r]


@pytest.mark.slow
def test_two_loopback_nodes_train_like_one_node(make_config, tmp_path: Path) -> None:
    def config(log: str, **trainer):  # a node left alone gives up after 60 s (rendezvous) or 60 s (collectives)
        return yaml.safe_dump(make_config(
            trainer={"max_steps": 4, **trainer}, launcher={"rdzv_join_timeout": 60, "rdzv_read_timeout": 20},
            distributed_strategy={"collective_timeout": 60},
            exp_manager={"explicit_log_dir": str(tmp_path / log), "create_checkpoint_callback": False}))

    one = tmp_path / "one_node.yaml"
    one.write_text(config("one"))
    proc = _nxd_train(one, {})
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    reference = _losses(tmp_path / "one")
    assert len(reference) == 4

    # SLURM: one `nxd train` per node (as srun starts them), TP=2 across the two nodes
    two = tmp_path / "two_nodes.yaml"
    two.write_text(config("slurm", devices=1, num_nodes=2))
    port = str(_free_port())
    slurm = {**SLURM, "SLURM_JOB_NODELIST": "127.0.0.1", "NXD_RDZV_PORT": port}
    nodes = [_nxd_train(two, {**slurm, "SLURM_NODEID": str(rank)}) for rank in (0, 1)]
    outs = _wait_nodes(nodes, timeout=400, grace=90)
    assert "slurm: node 1 of 2, rendezvous at 127.0.0.1:" in outs[1]
    assert _losses(tmp_path / "slurm") == reference  # bit-identical on CPU
    # a Kubernetes PyTorchJob-style environment (PET_*) launches the same way: two such nodes train in
    # test_a_rank_dying_on_one_node_is_named_by_node_and_rank, one alone in the next test


@pytest.mark.slow
def test_a_node_left_alone_exits_within_the_join_timeout_naming_the_missing_node(make_config, tmp_path: Path) -> None:
    """Node 1 of 2 starts, node 0 never comes (it died before the rendezvous): node 1 gives up after
    launcher.rdzv_join_timeout and its last line names node 0."""
    import time

    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(make_config(trainer={"max_steps": 2, "devices": 1, "num_nodes": 2},
                                               launcher={"rdzv_join_timeout": 3}, exp_manager={
        "explicit_log_dir": str(tmp_path / "run"), "create_checkpoint_callback": False})))
    pet = {"PET_NNODES": "2", "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(_free_port()), "PET_NODE_RANK": "1"}
    start = time.monotonic()
    node = _nxd_train(path, pet)
    out, _ = node.communicate(timeout=120)
    took = time.monotonic() - start
    assert node.returncode != 0, out
    last = out.strip().splitlines()[-1]
    assert last.startswith("nxd train: node 1 of 2: the rendezvous at 127.0.0.1:"), out
    assert "launcher.rdzv_join_timeout=3s: node 0 never joined" in last, out
    print(f"\nnode 1 alone: exited {took:.1f}s after start (join timeout 3 s)")


@pytest.mark.parametrize(("name", "nodes"), [("hf_llama3_8B_config", 4), ("megatron_llama_70b_config", 8)])
def test_nxdt_multi_node_configs_take_their_launch_from_slurm(name: str, nodes: int) -> None:
    """NxDT's multi-node configs, unedited (no launcher keys), get endpoint and node rank from a SLURM job."""
    path = Path(__file__).parent / "data" / "nxdt_conf" / f"{name}.yaml"
    config = load_config(path, [], check=False)
    assert config.trainer.num_nodes == nodes and config.launcher.rdzv_endpoint is None
    env = {**SLURM, "SLURM_NNODES": str(nodes), "SLURM_JOB_NODELIST": f"trn1-[001-{nodes:03d}]", "SLURM_NODEID": "2"}
    filled, note = apply_cluster(config, env)
    assert (filled.launcher.rdzv_endpoint, filled.launcher.node_rank) == (f"trn1-001:{DEFAULT_RDZV_PORT}", 2)
    assert f"node 2 of {nodes}" in note


@pytest.mark.slow
def test_a_rank_dying_on_one_node_is_named_by_node_and_rank(make_config, tmp_path: Path) -> None:
    """Two loopback nodes of one rank each; global rank 1 is killed by SIGSEGV at step 3. The c10d
    rendezvous numbers ranks in the order nodes arrive, so either node may host it: that node's last
    line names rank 1 on it (its PET_NODE_RANK, the node as the user knows it), local rank 0, how and
    at which step; the other node, whose rank only lost its peer, points to the other node instead
    of blaming itself or making up a cause."""
    import re

    log_dir = tmp_path / "run"
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(make_config(
        trainer={"max_steps": 1000, "devices": 1, "num_nodes": 2},
        launcher={"rdzv_join_timeout": 60, "rdzv_read_timeout": 20},
        distributed_strategy={"tensor_model_parallel_size": 1, "collective_timeout": 30},
        exp_manager={"explicit_log_dir": str(log_dir), "create_checkpoint_callback": False})))
    env = {"PET_NNODES": "2", "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(_free_port()),
           **rank1_dies_env(tmp_path, log_dir / "metrics.jsonl", "segv")}
    nodes = [_nxd_train(path, {**env, "PET_NODE_RANK": str(node)}) for node in (0, 1)]
    outs = [n.communicate(timeout=400)[0] for n in nodes]
    report = "\n".join(f"--- node {i} (exit {n.returncode}) ---\n{o[-4000:]}" for i, (n, o) in enumerate(zip(nodes, outs)))
    assert all(n.returncode != 0 for n in nodes), report
    last = [o.strip().splitlines()[-1] for o in outs]
    segv = [i for i, o in enumerate(outs) if "(SIGSEGV)" in o]  # torchrun's summary on the node that hosted it
    assert len(segv) == 1, report
    host, other = segv[0], 1 - segv[0]
    assert re.match(rf"nxd train: rank 1 \(node {host}, local rank 0\) failed first: it was killed by SIGSEGV "
                    r"\(exit code -11\) at step \d+ of 1000$", last[host]), report
    assert last[other].startswith(f"nxd train: node {other} of 2: the rank that failed first is on another node "
                                  "(rank 1 left nothing here); this node's rank 0 only lost its peers"), report
    print("\n" + "\n".join(last))
