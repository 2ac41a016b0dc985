"""The one line ``nxd train`` ends a failed multi-rank run with, read from what torchrun printed."""

from __future__ import annotations

from nxd_training.config.schema import TrainingConfig

# torchrun's rendezvous errors carry no message of their own: the exception's name is the signal
_TIMEOUT, _LOST = "RendezvousTimeoutError", ("RendezvousConnectionError", "RendezvousClosedError")


def rendezvous_failure(config: TrainingConfig, stderr_tail: str) -> str | None:
    """On a multi-node run whose torchrun gave up in the rendezvous: which node this is, how long it
    waited, and the node(s) that never joined or went away; None for any other failure."""
    lc, nodes = config.launcher, config.trainer.num_nodes
    if nodes < 2:
        return None
    me = lc.node_rank
    others = [n for n in range(nodes) if n != me]
    missing = f"node {others[0]}" if len(others) == 1 else "one of nodes " + ", ".join(map(str, others))
    where = f"node {me} of {nodes}" if me is not None else f"this node (of {nodes})"
    if _TIMEOUT in stderr_tail:
        return (f"nxd train: {where}: the rendezvous at {lc.rdzv_endpoint} did not complete within "
                f"launcher.rdzv_join_timeout={lc.rdzv_join_timeout}s: {missing} never joined or went away "
                "before it completed (see that node's output; docs/cluster.md)")
    if any(name in stderr_tail for name in _LOST):
        return (f"nxd train: {where}: lost the rendezvous at {lc.rdzv_endpoint} (no answer within "
                f"launcher.rdzv_read_timeout={lc.rdzv_read_timeout}s): {missing}, hosting it, went away "
                "(see that node's output; docs/cluster.md)")
    return None
