"""``nxd plot``: loss and throughput curves of one or several runs, as a PNG (matplotlib, Agg)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from nxd_training.exp_manager import read_metrics


def _label(run_dir: Path) -> str:
    parts = run_dir.resolve().parts
    return "/".join(parts[-2:]) if len(parts) >= 2 else str(run_dir)


def plot_runs(run_dirs: Sequence[str | Path], out: str | Path, metrics: Sequence[str] = ("loss", "tokens_per_s")) -> Path:
    """Draw ``metrics`` (one panel each) against step for every run; validation loss joins the
    loss panel. Returns the PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(metrics), figsize=(6 * len(metrics), 4), squeeze=False)
    for run in map(Path, run_dirs):
        train = read_metrics(run, "train")
        if not train:
            raise ValueError(f"{run}: no training metrics found (expected metrics.jsonl with 'train' records)")
        valid = read_metrics(run, "valid")
        for ax, key in zip(axes[0], metrics):
            points = [(r["step"], r[key]) for r in train if key in r]
            if points:
                ax.plot(*zip(*points), label=f"{_label(run)} train")
            if key == "loss" and valid:
                ax.plot([r["step"] for r in valid], [r["loss"] for r in valid], "o--", label=f"{_label(run)} valid")
    for ax, key in zip(axes[0], metrics):
        ax.set_xlabel("step")
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
