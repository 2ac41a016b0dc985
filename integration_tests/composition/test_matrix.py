"""The composition matrix: every pair of the values users combine (family, workflow, data-parallel
strategy, TP/SP, PP, CP, EP, precision, adapter, start, resume layout) in at least one cell.

Each cell goes through ``nxd train``'s own path: ``nxd train CFG --validate`` (the real command, in
process), then ``prepare_run`` + ``write_run_config`` as ``nxd train`` runs them, and the ranks do
what ``python -m nxd_training.worker <run>/config.yaml`` does, on a shared pool of gloo ranks (one
torchrun per cell would cost minutes; the launcher itself is tested by nxd-training's CLI tests).
Its outcome is either **refused** by ``--validate`` (reason recorded), or **trained** and then:
- resumed from the step-1 checkpoint (same layout: the step-2 loss bitwise equal to the
  uninterrupted run's; ``reshard``: on the other layout, within fp32 reduction-order tolerance);
- exported to Hugging Face with ``nxd ckpt convert --from nxd --to hf`` and loaded by transformers
  with no missing or unexpected weights (LoRA runs: ``--lora merge``, and the PEFT adapter).
A cell that validates and then fails is a failure: "validated, then failed on a rank" is a bug.

The outcomes are the table in docs/composition.md: a changed outcome fails the test until the table
is regenerated (``NXD_WRITE_COMPOSITION_TABLE=1``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from axes import AXES, allowed
from cells import STEPS, Inputs, cell_id, config, layout
from pairwise import pairwise

from nxd.cli import main

CELLS = pairwise(AXES, allowed)
ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "docs" / "composition.md"
RESULTS: dict[str, dict[str, Any]] = {}
#: fp32 reduction order differs between layouts: a few ulps per reduction, bounded well under this
RESHARD_RTOL = 1e-5


def _train(config_path: str) -> dict[str, Any]:
    """One rank: what ``python -m nxd_training.worker <run>/config.yaml`` does."""
    from nxd_training.config import load_resolved
    from nxd_training.loop import Trainer

    trainer = Trainer(load_resolved(config_path))
    try:
        result = trainer.fit()
    finally:
        trainer.close()
    return {"losses": result.losses, "final": result.final_step, "resumed": getattr(result, "resumed_from", None)}


def _validate(cfg: dict[str, Any], path: Path) -> tuple[int, str]:
    """``nxd train CFG --validate``, in a forked copy of this process: the real command with every
    import already done, and nothing its fake-world rank builds leave behind reaches the next cell."""
    path.write_text(yaml.safe_dump(cfg))
    out = path.with_suffix(".validate.txt")
    pid = os.fork()
    if pid == 0:  # the child: the command, its output to a file, then leave without running pytest's exit
        rc = 70
        try:
            fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            sys.stdout = os.fdopen(1, "w", buffering=1)
            sys.stderr = sys.stdout
            rc = main(["train", str(path), "--validate"])
        finally:
            sys.stdout.flush()
            os._exit(rc if isinstance(rc, int) else 70)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out.read_text()


def _reason(said: str) -> str:
    """The refusal ``nxd train`` printed (its own lines; third-party warnings left out), paths shortened."""
    lines = said.strip().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("nxd train: ")]
    # the last of nxd's lines and the lines it continues on (a refusal may list its reasons below it)
    tail = lines[starts[-1]:] if starts else lines[-1:]
    tail = tail[:1] + [line for line in tail[1:] if line[:1].isspace() and "warnings.warn" not in line]
    reason = " ".join(line.strip() for line in tail)
    reason = reason[len("nxd train: "):] if reason.startswith("nxd train: ") else reason
    return re.sub(r"/\S*/(test_cell|pytest-of|tmp)\S*", "<path>", reason)


def _run(cfg_path: Path, pools, world: int) -> list[dict[str, Any]]:
    from nxd_training.cli import prepare_run
    from nxd_training.launcher import write_run_config

    run = prepare_run(str(cfg_path), [])
    path = write_run_config(run.config, run.log_dir)
    return pools(world).run(_train, str(path), timeout=300)


def _tag_of_step(run_dir: Path, step: int) -> Path:
    tags = [p for p in (run_dir / "checkpoints").iterdir() if p.is_dir() and re.search(rf"step[=_-]?0*{step}\b", p.name)]
    assert len(tags) == 1, f"no single checkpoint of step {step} in {run_dir / 'checkpoints'}: {sorted(os.listdir(run_dir / 'checkpoints'))}"
    return tags[0]


def _export_loads(cell: dict[str, str], run_dir: Path, out: Path) -> str:
    from transformers import AutoModelForCausalLM

    args = ["ckpt", "convert", "--from", "nxd", "--to", "hf", str(run_dir), "--output", str(out)]
    if cell["adapter"] == "lora":
        args += ["--lora", "merge"]
    assert main(args) == 0, f"nxd {' '.join(args)} failed"
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    logits = model(torch.arange(8).unsqueeze(0)).logits
    assert torch.isfinite(logits).all()
    return "export hf"


@pytest.mark.slow
@pytest.mark.parametrize("cell", CELLS, ids=[cell_id(c) for c in CELLS])
def test_cell(cell: dict[str, str], corpus, sft_file, pairs_file, hf_folder, nxd_checkpoint, pools,
              tmp_path: Path) -> None:
    family = cell["family"]
    inputs = Inputs(corpus, sft_file, pairs_file, hf_folder(family),
                    nxd_checkpoint(family) if cell["start"] == "nxd" else None)
    run_a = tmp_path / "a"
    cfg = config(cell, inputs, run_a)
    rc, said = _validate(cfg, tmp_path / "a.yaml")
    key = cell_id(cell)
    if rc != 0:
        RESULTS[key] = {"cell": cell, "outcome": "refused", "reason": _reason(said)}
        return
    sizes = layout(cell)
    world = sizes["tp"] * sizes["pp"] * sizes["cp"] * sizes["dp"]
    first = _run(tmp_path / "a.yaml", pools, world)
    losses = first[0]["losses"]
    assert sorted(losses) == list(range(1, STEPS + 1)), losses
    assert all(torch.isfinite(torch.tensor(v)) for v in losses.values()), losses

    reshard = cell["resume"] == "reshard"
    # resumed as a user resumes a stopped run: the same config again (auto-resume), here in a copy of
    # the run without its step-2 checkpoint, so the step-1 one is the newest
    run_b = tmp_path / "b"
    shutil.copytree(run_a, run_b, symlinks=True)
    shutil.rmtree(run_b / "checkpoints" / _tag_of_step(run_a, 2).name)
    cfg_b = config(cell, inputs, run_b, reshard=reshard)
    cfg_b["exp_manager"]["resume_if_exists"] = True
    rc, said = _validate(cfg_b, tmp_path / "b.yaml")
    export = _export_loads(cell, run_a, tmp_path / "hf")
    if rc != 0:
        assert reshard, f"the run validated and trained, resuming it on the same layout is refused: {said}"
        RESULTS[key] = {"cell": cell, "outcome": "trained", "checks": [f"resume on another layout refused: {_reason(said)}", export]}
        return
    sizes_b = layout(cell, reshard=reshard)
    second = _run(tmp_path / "b.yaml", pools, sizes_b["tp"] * sizes_b["pp"] * sizes_b["cp"] * sizes_b["dp"])
    resumed = second[0]["losses"]
    assert sorted(resumed) == [STEPS], resumed
    if reshard:
        rel = abs(resumed[STEPS] - losses[STEPS]) / abs(losses[STEPS])
        assert rel <= RESHARD_RTOL, (resumed, losses)
    else:
        assert resumed[STEPS] == losses[STEPS], (resumed, losses)
    steps = [f"resume {'resharded' if reshard else 'bitwise'}", export]
    RESULTS[key] = {"cell": cell, "outcome": "trained", "checks": steps}


def test_outcomes_match_the_table() -> None:
    """Run last (file order): every cell's outcome is the one docs/composition.md states."""
    if len(RESULTS) != len(CELLS):
        pytest.skip("only part of the matrix ran")
    from table import render

    text = render(CELLS, RESULTS)
    if os.environ.get("NXD_WRITE_COMPOSITION_TABLE"):
        TABLE.write_text(text)
    assert TABLE.read_text() == text, "outcomes changed: regenerate docs/composition.md with NXD_WRITE_COMPOSITION_TABLE=1"


def test_every_pair_is_covered() -> None:
    from pairwise import _pairs_of, feasible_pairs

    covered = set().union(*(_pairs_of(c, list(AXES)) for c in CELLS))
    assert feasible_pairs(AXES, allowed) <= covered
    assert json.dumps(CELLS)  # plain data: the table renders it
