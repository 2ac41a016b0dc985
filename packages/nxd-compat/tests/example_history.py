"""One-off sweep (not a test): NxD's ``tp_zero1_llama(2)_hf_pretrain`` script at each release that
changed it, unchanged, with that release's helper modules and config.json (shrunk), in a layered
environment with the transformers its requirements.txt pins; one process vs TP=2 (+SP) losses.
Results are tabled in docs/nxdt-compat.md ("Across NxD's releases").

    python example_history.py NXD_REPO_GIT_DIR WORK_DIR COMMIT[,COMMIT...]
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from example_run import MAKE_DATA, TINY_LLAMA, rel, step_losses, torchrun
from legacy_env import LEGACY_PINS, NEOX_PINS, build

#: transformers 4.31 (NxD 2.16-2.23's pin) with the tokenizers / hub versions it needs
PINS_431 = tuple(p.replace("4.26.0", "4.31.0").replace("tokenizers>=0.11", "tokenizers>=0.13") for p in NEOX_PINS)
SIZE_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "num_key_value_heads",
             "vocab_size", "max_position_embeddings", "torch_dtype", "pad_token_id", "bos_token_id", "eos_token_id")


def train(python: Path, run: Path, script: str, name: str, nproc: int,
          *extra: str) -> tuple[list[float] | None, str | None]:
    """The script's per-step losses at the tiny size, or the last error line it printed."""
    try:
        torchrun(python, run, nproc, script, "--model_path", "tiny_llama", "--data_dir", "data", "--output_dir",
                 name, "--metrics_file", f"{name}/results.json", "--max_steps", "3", "--steps_this_run", "3",
                 "--warmup_steps", "1", "--grad_accum_usteps", "1", "--seq_len", "32", "--use_zero_1",
                 "--logging_interval", "1", "--batch_size", "2", *extra)
        return step_losses(run / name), None
    except AssertionError as failed:
        errors = [line for line in str(failed).splitlines() if "Error" in line]
        return None, errors[-1] if errors else str(failed)[-300:]


def sweep(repo: str, root: Path, commits: list[str]) -> list[dict]:
    def git(*args: str) -> bytes:
        return subprocess.run(["git", "-C", repo, *args], capture_output=True, check=True).stdout

    envs: dict[str, Path] = {}
    results = []
    for commit in commits:
        folder = "llama" if b"requirements.txt" in git("ls-tree", "--name-only", commit, "examples/training/llama/") \
            else "llama2"
        pin = re.search(r"transformers==([0-9.]+)", git("show", f"{commit}:examples/training/{folder}/requirements.txt")
                        .decode()).group(1)
        if pin not in envs:
            envs[pin] = build(root / f"env{pin}", LEGACY_PINS if pin == "4.48.0" else PINS_431)
        python, run = envs[pin], root / commit
        shutil.rmtree(run, ignore_errors=True)
        run.mkdir(parents=True)
        tarfile.open(fileobj=io.BytesIO(git("archive", commit, f"examples/training/{folder}"))).extractall(run / "src")
        base = run / "src" / "examples" / "training" / folder
        script_dir = next(p for p in base.iterdir() if p.is_dir() and re.fullmatch(r"tp_zero1_llama2?(_7b)?_hf_pretrain", p.name))
        for path in [*script_dir.glob("*.py"), *base.glob("*.py")]:
            shutil.copy(path, run / path.name)
        script = next(p.name for p in script_dir.glob("tp_zero1*.py"))
        config = json.loads(TINY_LLAMA)
        shipped = [p for p in (script_dir / "config.json", script_dir / "7B_config_llama2" / "config.json") if p.exists()]
        if shipped:  # the release's own config.json (keys its modeling reads), at the tiny size
            config = {**json.loads(shipped[0].read_text()), **{k: config[k] for k in SIZE_KEYS}}
        (run / "tiny_llama").mkdir()
        (run / "tiny_llama" / "config.json").write_text(json.dumps(config))
        subprocess.run([str(python), "-c", MAKE_DATA, str(run / "data")], check=True, capture_output=True)
        flags = (run / script).read_text()

        one, error = train(python, run, script, "one", 1, "--tensor_parallel_size", "1")
        retry: list[str] = []
        if one is None and "--use_flash_attention" in flags:
            retry = ["--use_flash_attention", "0"]
            one, _ = train(python, run, script, "one_no_flash", 1, "--tensor_parallel_size", "1", *retry)
        sp = ["--sequence_parallel_enabled"] if "--sequence_parallel_enabled" in flags else []
        tp2, tp2_error = train(python, run, script, "tp2", 2, "--tensor_parallel_size", "2", *sp, *retry) if one else (None, "not run")
        results.append({"commit": commit, "date": git("log", "-1", "--format=%ad", "--date=short", commit).decode().strip(),
                        "script": f"{folder}/{script_dir.name}/{script}", "transformers": pin, "retry": retry,
                        "one": one, "tp2": tp2, "rel": rel(tp2, one) if one and tp2 else None, "error": error,
                        "tp2_error": tp2_error})
        print(json.dumps(results[-1]), flush=True)
    return results


if __name__ == "__main__":
    repo_dir, work = sys.argv[1], Path(sys.argv[2])
    (work / "results.json").write_text(json.dumps(sweep(repo_dir, work, sys.argv[3].split(",")), indent=1))
