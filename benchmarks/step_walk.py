"""The walk of one optimizer step of a tiny ``nxd train`` run: how many places of nxd's own code the
path from config resolution to the end of step 1 passes through.

Run in-process (one rank, CPU) with ``sys.setprofile``; only nxd's first-party code counts
(``packages/*/src`` and ``registry/src``; comprehensions and lambdas belong to their function;
plugins are discovered and the trainer's modules imported before the walk starts):

- stops: distinct first-party functions called, in the order first called;
- rooms: distinct modules those functions live in;
- returns: moves along that order into a module the walk had already left (a room re-entered).

Also counts the functions of ``packages/*/src`` that take the whole ``TrainingConfig`` (a parameter
annotated ``TrainingConfig``): every one reads any key it likes.

    python benchmarks/step_walk.py [--json] [--list]
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(ROOT.glob("packages/*/src")) + [ROOT / "registry" / "src"]
CONFIG_TYPES = ("TrainingConfig",)


def _module_of(filename: str) -> str | None:
    for src in SOURCES:
        prefix = str(src) + "/"
        if filename.startswith(prefix):
            return filename[len(prefix):-len(".py")].replace("/", ".").removesuffix(".__init__")
    return None


class Walk:
    """First-party calls between ``start()`` and the return of the first ``Trainer.train_step``."""

    def __init__(self) -> None:
        self.stops: list[tuple[str, str]] = []
        self._seen: set[tuple[str, str]] = set()
        self.done = False

    def __call__(self, frame, event: str, arg) -> None:
        if self.done or event not in ("call", "return"):
            return
        code = frame.f_code
        if code.co_name.startswith("<") or not code.co_flags & inspect.CO_NEWLOCALS:
            return  # comprehensions, lambdas, module and class bodies belong to their surroundings
        module = _module_of(code.co_filename)
        if module is None:
            return
        name = code.co_qualname
        if event == "return":
            self.done = module == "nxd_training.loop" and name == "Trainer.train_step"
            return
        key = (module, name)
        if key not in self._seen:
            self._seen.add(key)
            self.stops.append(key)

    def summary(self) -> dict[str, int]:
        rooms: set[str] = set()
        left: set[str] = set()
        returns, current = 0, None
        for module, _ in self.stops:
            if module != current:
                if module in left:
                    returns += 1
                if current is not None:
                    left.add(current)
                current = module
            rooms.add(module)
        return {"stops": len(self.stops), "rooms": len(rooms), "returns": returns}


def functions_taking_whole_config() -> list[str]:
    """``module:function`` of every function in packages/*/src with a TrainingConfig parameter."""
    found = []
    for src in SOURCES[:-1]:
        for path in sorted(src.rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                if any(a.annotation is not None and any(t in ast.unparse(a.annotation) for t in CONFIG_TYPES)
                       for a in args):
                    found.append(f"{_module_of(str(path))}:{node.name}")
    return found


def tiny_run(workdir: Path) -> Path:
    """A one-rank, one-step YAML config on the quickstart corpus (no checkpoint, validation or logger)."""
    from nxd_data.quickstart import prepare_quickstart_data

    corpus = prepare_quickstart_data(workdir / "corpus", vocab_size=512)
    config = {
        "name": "walk", "seed": 7,
        "trainer": {"devices": 1, "max_steps": 1, "log_every_n_steps": 1, "val_check_interval": 0,
                    "enable_progress_bar": False, "accelerator": "cpu"},
        "exp_manager": {"exp_dir": str(workdir / "runs"), "create_tensorboard_logger": False,
                        "create_checkpoint_callback": False},
        "distributed_strategy": {"tensor_model_parallel_size": 1},
        "data": {"module": "indexed", "data_prefix": corpus["data_prefix"], "tokenizer": corpus["tokenizer"],
                 "micro_batch_size": 2, "global_batch_size": 2, "seq_length": 32, "splits_string": "950,50,0"},
        "model": {"architecture": "llama", "vocab_size": 512, "hidden_size": 32, "ffn_hidden_size": 64,
                  "num_layers": 2, "num_attention_heads": 4, "num_kv_heads": 2, "max_position_embeddings": 64,
                  "optim": {"name": "adamw", "lr": 1e-2, "sched": {"name": "constant"}}},
        "precision": {"type": "fp32"},
    }
    path = workdir / "walk.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


#: imported before the walk starts: the walk is the run, not the first import of its modules
PRELOAD = ("nxd_training.cli", "nxd_training.loop", "nxd_training.launcher", "nxd_training.preflight",
           "nxd_training.cluster", "nxd_training.data_prep")


def measure() -> tuple[Walk, list[str]]:
    import nxd
    from nxd.cli import main

    nxd.plugins.state()  # plugin discovery (entry points imported) happens once per process, before
    for name in PRELOAD:
        importlib.import_module(name)
    walk = Walk()
    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_run(Path(tmp))
        sys.setprofile(walk)
        try:
            code = main(["train", str(path)])
        finally:
            sys.setprofile(None)
    if code != 0 or not walk.done:
        raise SystemExit(f"step_walk: the tiny run did not finish a step (exit code {code})")
    return walk, functions_taking_whole_config()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--list", action="store_true", help="also print the stops in order")
    args = parser.parse_args()
    walk, whole = measure()
    result = {**walk.summary(), "functions_taking_training_config": len(whole)}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"step walk: {result['stops']} stops in {result['rooms']} rooms, {result['returns']} returns; "
              f"{result['functions_taking_training_config']} functions take the whole TrainingConfig")
    if args.list:
        for module, name in walk.stops:
            print(f"  {module}:{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
