"""Every hookspec is implemented by the test plugin below and called by the core through its
public API; a hookspec added without a test here, or without docs/hooks.md, fails."""

from __future__ import annotations

import contextlib
import inspect
import os
import re

import pytest
import torch
import torch.distributed as dist

import nxd
import nxd.plugins
import nxd.trainer
from nxd import hookspecs


def _hookspec_names() -> set[str]:
    return {name for name, fn in inspect.getmembers(hookspecs, inspect.isfunction) if hasattr(fn, "nxd_spec")}


class RecordingPlugin:
    """Implements every hook and records how the core called it."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.saved: dict = {}

    # registration hooks
    @nxd.hookimpl
    def nxd_register_backends(self, registry):
        registry.add("toy-backend", "backend")

    @nxd.hookimpl
    def nxd_register_models(self, registry):
        registry.add("toy-model", "model")

    @nxd.hookimpl
    def nxd_register_pipeline_schedules(self, registry):
        registry.add("1f1b", "schedule")

    @nxd.hookimpl
    def nxd_register_optimizers(self, registry):
        def factory(config, optimizer_class, parameters, **defaults):
            self.calls.append(("optimizer", defaults))
            return optimizer_class(parameters, **defaults)

        registry.add("default", factory)
        registry.add("zero1", factory)

    @nxd.hookimpl
    def nxd_register_model_transforms(self, registry):
        def make_optimizer(config, optimizer_class, parameters, *, context, **defaults):
            self.calls.append(("optimizer", defaults))
            return optimizer_class(parameters, **defaults)

        def wrap(model, context, config):
            self.calls.append(("transform", "ddp", type(model).__name__))
            return None

        def after_step(optimizer, context, config):
            self.calls.append(("after_optimizer_step", type(optimizer).__name__))
            return lambda: self.calls.append(("stepped",))

        registry.add("ddp", nxd.transforms.ModelTransform(
            "ddp", "data_parallel", wrap, make_optimizer=make_optimizer, after_optimizer_step=after_step))
        registry.add("toy-parallel-plan", nxd.transforms.ModelTransform(
            "toy-parallel-plan", "parallel_plan",
            lambda model, context, config: self.calls.append(("transform", "plan", type(model).__name__)),
            applies=lambda context, config: config.tensor_parallel_size == 1))

    @nxd.hookimpl
    def nxd_register_adapters(self, registry):
        registry.add("lora", "adapter")

    @nxd.hookimpl
    def nxd_register_checkpoint_formats(self, registry):
        registry.add("toy-format", "format")

    @nxd.hookimpl
    def nxd_register_storages(self, registry):
        registry.add("toy-storage", "storage")

    @nxd.hookimpl
    def nxd_register_checkpointers(self, registry):
        plugin = self

        class Checkpointer:
            # Like nxd-ckpt's checkpointer: plugins' extras run after the commit and after a load.
            def save(self, path, **kwargs):
                plugin.saved[path] = kwargs
                nxd.trainer.checkpoint_extras(kwargs["model"], path, kwargs["tag"], "saved")

            def load(self, path, **kwargs):
                nxd.trainer.checkpoint_extras(kwargs["model"], path, kwargs["tag"] or "t", "loaded")
                return plugin.saved[path]["user_content"]

            def has_checkpoint(self, path):
                return path in plugin.saved

            def finalize(self):
                plugin.calls.append(("finalize",))

        registry.add("default", Checkpointer())

    @nxd.hookimpl
    def nxd_register_data_modules(self, registry):
        registry.add("toy-data", "data")

    @nxd.hookimpl
    def nxd_register_workflows(self, registry):
        registry.add("toy-workflow", "workflow")

    @nxd.hookimpl
    def nxd_register_checkpoint_converters(self, registry):
        registry.add("toy-converter", "converter")

    @nxd.hookimpl
    def nxd_register_commands(self, registry):
        registry.add("toy", nxd.Command(help="toy verb", add_arguments=lambda p: p.add_argument("--n", type=int),
                                        run=lambda args: self.calls.append(("command", args.n)) or 0))

    # lifecycle hooks
    @nxd.hookimpl
    def nxd_validate_config(self, nxd_config):
        self.calls.append(("validate", nxd_config.tensor_parallel_size))
        if nxd_config.pipeline_config.get("toy_key") == "bad":
            raise nxd.ConfigError("pipeline_config.toy_key must be 'good'")

    @nxd.hookimpl
    def nxd_initialize_parallel(self, nxd_config):
        self.calls.append(("initialize_parallel", nxd_config.tensor_parallel_size))
        return _world_context()

    @nxd.hookimpl
    def nxd_build_model(self, nxd_config, model_fn, model_args, model_kwargs):
        self.calls.append(("build", model_args, model_kwargs))
        return model_fn(*model_args, **model_kwargs)

    @nxd.hookimpl
    def nxd_checkpoint_extras(self, model, path, tag, phase):
        self.calls.append(("checkpoint_extras", type(model).__name__, path, tag, phase))

    @nxd.hookimpl
    def nxd_plan_run(self, config, device_memory_gib):
        self.calls.append(("plan_run", config, device_memory_gib))
        return f"plan of {config}"


def _world_context() -> nxd.parallel.ParallelContext:
    """Every rank one tensor-parallel group: the smallest context a toy runtime can return."""
    world, rank = dist.get_world_size(), dist.get_rank()
    ranks = tuple(range(world))

    def dim(name: str, size: int) -> nxd.parallel.ParallelDim:
        mine = ranks if size > 1 else (rank,)
        return nxd.parallel.ParallelDim(name, size, mine.index(rank), mine, dist.group.WORLD if size > 1 else None)

    dims = {name: dim(name, world if name == "tp" else 1) for name in nxd.parallel.DIMENSIONS}
    return nxd.parallel.ParallelContext(world, rank, None, torch.device("cpu"), nxd.parallel.DEFAULT_TIMEOUT, **dims)


def test_test_plugin_implements_every_hookspec():
    implemented = {name for name in dir(RecordingPlugin) if name.startswith("nxd_")}
    assert implemented == _hookspec_names()


def test_every_hook_is_called_through_the_public_api(tmp_path, capsys):
    plugin = RecordingPlugin()
    nxd.register_plugin(plugin, name="recording", distribution="tests")
    for kind, name in [("backend", "toy-backend"), ("model", "toy-model"), ("pipeline_schedule", "1f1b"),
                       ("adapter", "lora"), ("checkpoint_format", "toy-format"), ("storage", "toy-storage"),
                       ("data_module", "toy-data"), ("workflow", "toy-workflow"),
                       ("checkpoint_converter", "toy-converter")]:
        assert nxd.get_component(kind, name) is not None
    assert nxd.get_workflow("toy-workflow") == "workflow"

    config = nxd.neuronx_distributed_config(tensor_parallel_size=1, pipeline_parallel_size=2)
    assert ("validate", 1) in plugin.calls
    with pytest.raises(nxd.ConfigError, match="toy_key must be 'good'"):
        nxd.neuronx_distributed_config(pipeline_config={"toy_key": "bad"})

    model = nxd.initialize_parallel_model(config, torch.nn.Linear, False, 3, 2, bias=False)
    assert ("build", (3, 2), {"bias": False}) in plugin.calls
    phases = [call[1] for call in plugin.calls if call[0] == "transform"]
    assert phases == ["plan", "ddp"]  # the registered transforms, in order
    assert isinstance(model, torch.nn.Linear)

    optimizer = nxd.initialize_parallel_optimizer(config, torch.optim.SGD, model.parameters(), lr=0.5)
    assert isinstance(optimizer, torch.optim.SGD) and ("optimizer", {"lr": 0.5}) in plugin.calls
    assert ("after_optimizer_step", "SGD") in plugin.calls and ("stepped",) not in plugin.calls
    optimizer.step()
    assert plugin.calls[-1] == ("stepped",)  # after each step of the optimizer

    nxd.save_checkpoint(str(tmp_path), tag="t", model=model, user_content={"step": 3}, num_kept_ckpts=2)
    assert nxd.has_checkpoint(str(tmp_path))
    assert nxd.load_checkpoint(str(tmp_path), model=model) == {"step": 3}
    extras = [call for call in plugin.calls if call[0] == "checkpoint_extras"]
    assert extras == [("checkpoint_extras", "Linear", str(tmp_path), "t", phase) for phase in ("saved", "loaded")]
    with pytest.raises(ValueError, match="phase must be one of"):
        nxd.trainer.checkpoint_extras(model, str(tmp_path), "t", "written")
    assert plugin.saved[str(tmp_path)]["num_kept_ckpts"] == 2
    nxd.finalize_checkpoint()
    assert ("finalize",) in plugin.calls

    assert nxd.trainer.plan_run("toy-config", 16.0) == "plan of toy-config"
    assert ("plan_run", "toy-config", 16.0) in plugin.calls

    from nxd.cli import main

    assert main(["toy", "--n", "7"]) == 0 and ("command", 7) in plugin.calls


@contextlib.contextmanager
def _only_test_plugins():
    """Discover no installed plugin inside the block; the rank process gets its own back after it
    (the pool is shared with other tests)."""
    before = os.environ.get("NXD_LOAD_PLUGINS")
    os.environ["NXD_LOAD_PLUGINS"] = ""
    nxd.plugins.reset()
    try:
        yield
    finally:
        nxd.parallel.set_parallel_context(None)
        if before is None:
            os.environ.pop("NXD_LOAD_PLUGINS", None)
        else:
            os.environ["NXD_LOAD_PLUGINS"] = before
        nxd.plugins.reset()


def _initialize_parallel_on_rank() -> list:
    with _only_test_plugins():
        return _initialize_parallel()


def _initialize_parallel() -> list:
    with pytest.raises(nxd.ComponentNotFound, match="pip install nxd-core-parallel"):
        nxd.neuronx_distributed_config(tensor_parallel_size=2)
    plugin = RecordingPlugin()
    nxd.register_plugin(plugin, name="recording", distribution="tests")
    nxd.neuronx_distributed_config(tensor_parallel_size=2)
    context = nxd.parallel.get_parallel_context()
    nxd.parallel.set_parallel_context(None)
    return [call for call in plugin.calls if call[0] == "initialize_parallel"] + [dist.get_world_size(), context.tp.size]


def test_initialize_parallel_runs_when_distributed_is_up(rank_pool):
    assert rank_pool(2).run(_initialize_parallel_on_rank) == [[("initialize_parallel", 2), 2, 2]] * 2


class ContextRecorder:
    """Names ``context`` in every lifecycle hook that has one (the RecordingPlugin, which does not,
    keeps working beside it)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, object]] = []

    @nxd.hookimpl
    def nxd_build_model(self, context):
        self.seen.append(("build", context))

    @nxd.hookimpl
    def nxd_register_model_transforms(self, registry):
        def after_step(optimizer, context, config):
            self.seen.append(("after_optimizer_step", context))

        registry.add("context-recorder", nxd.transforms.ModelTransform(
            "context-recorder", nxd.transforms.after("data_parallel"), lambda model, context, config: None,
            after_optimizer_step=after_step))

    @nxd.hookimpl
    def nxd_checkpoint_extras(self, phase, context):
        self.seen.append((f"extras:{phase.value}", context))


def _context_reaches_hooks_on_rank(tmp: str) -> list[str]:
    with _only_test_plugins():
        return _context_reaches_hooks(tmp)


def _context_reaches_hooks(tmp: str) -> list[str]:
    nxd.register_plugin(RecordingPlugin(), name="recording", distribution="tests")
    recorder = ContextRecorder()
    nxd.register_plugin(recorder, name="context-recorder", distribution="tests")
    config = nxd.neuronx_distributed_config(tensor_parallel_size=2)
    context = nxd.parallel.get_parallel_context()
    model = nxd.initialize_parallel_model(config, torch.nn.Linear, False, 3, 2)
    nxd.initialize_parallel_optimizer(config, torch.optim.SGD, model.parameters(), lr=0.5)
    nxd.save_checkpoint(f"{tmp}/{dist.get_rank()}", tag="t", model=model)
    nxd.load_checkpoint(f"{tmp}/{dist.get_rank()}", model=model)
    assert all(seen is context for _, seen in recorder.seen), recorder.seen
    return [name for name, _ in recorder.seen]


def test_lifecycle_hooks_receive_the_parallel_context(rank_pool, tmp_path):
    names = ["build", "after_optimizer_step", "extras:saved", "extras:loaded"]
    assert rank_pool(2).run(_context_reaches_hooks_on_rank, str(tmp_path)) == [names] * 2


def test_components_get_the_context_only_when_they_name_it():
    def with_context(a, *, b, context):
        return a, b, context

    def without(a, **kwargs):
        return a, kwargs

    marker = object()
    assert nxd.parallel.call_with_context(with_context, 1, b=2, context=marker) == (1, 2, marker)
    assert nxd.parallel.call_with_context(without, 1, b=2, context=marker) == (1, {"b": 2})
    assert nxd.parallel.bind_context(with_context, marker)(1, b=2) == (1, 2, marker)
    assert nxd.parallel.bind_context(without, marker) is without
    assert not nxd.parallel.accepts_context(print)


def test_docs_describe_every_hook(repo_root):
    text = (repo_root / "docs" / "hooks.md").read_text()
    for name in sorted(_hookspec_names()):
        params = ", ".join(inspect.signature(getattr(hookspecs, name)).parameters)
        assert re.search(rf"^### `{name}\({re.escape(params)}\)`", text, re.M), f"docs/hooks.md lacks '### `{name}({params})`'"
