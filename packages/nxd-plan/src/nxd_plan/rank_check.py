"""Validation by construction: what a rank of ``nxd train`` builds before its first step, through the
ranks' own functions on the meta device in the fake world (:mod:`nxd_plan.fake_world`): the model
with every transform (:func:`nxd_plan.fake_world.build_rank_model`), the Hugging Face weights' load
(names and shapes against the files' headers, no tensor data), the optimizer with its data-parallel
wrapping and the learning-rate scheduler (``nxd_training.build``, as ``nxd_training.loop`` calls
them). A rank that cannot be built is a :class:`RankBuildError`: a refusal before launch naming the
rank, its coordinates, the step and the YAML keys."""

from __future__ import annotations

from typing import Any

import torch

from nxd import ConfigError


class RankBuildError(ConfigError):
    """Rank ``rank`` of the run cannot be built: the error its own build path raised at ``step``."""

    def __init__(self, rank: int, coords: dict[str, int], step: str, cause: BaseException, config: Any) -> None:
        from nxd_training.config.nxdt import yaml_keys_named

        where = ", ".join(f"{k} {v}" for k, v in coords.items() if k in ("tp", "pp", "cp", "dp", "ep"))
        text = str(cause) if isinstance(cause, ConfigError) else f"{type(cause).__name__}: {cause}"
        keys = yaml_keys_named(text, config)
        super().__init__(f"rank {rank} ({where}) fails in {step}: {text}" + (f" [{', '.join(keys)}]" if keys else ""))
        self.rank, self.coords, self.step = rank, coords, step


def build_rank(config: Any, run: Any, rank: int) -> tuple[torch.nn.Module, Any, Any]:
    """Inside :func:`nxd_plan.fake_world.fake_rank`: rank ``rank``'s model (returned with its context
    and NxD config) and the rest of its build path; a :class:`RankBuildError` when a step fails."""
    from nxd_modeling.hf_interop import headers_only
    from nxd_plan.fake_world import build_rank_model
    from nxd_plan.layout import layout_of
    from nxd_training import build
    from nxd_training.config.resolved import model_spec_of

    step = "its model build (model section, parallel sizes, model transforms)"
    try:
        model, context, nxd_cfg = build_rank_model(config, run)
        folder = config.model.pretrained_checkpoint
        if build.loads_pretrained_late(config):  # else read by the model build itself (QLoRA)
            step = f"its load of model.pretrained_checkpoint={folder} (names and shapes from the files' headers)"
            with headers_only():
                build.load_pretrained(model_spec_of(run), model, nxd_cfg.lora_config is not None, folder)
        optim = config.model.optim
        step = f"its optimizer (model.optim.name={optim.name}) and its data-parallel wrapping"
        optimizer = build.build_optimizer(optim, build.param_groups(model, config.model.do_layer_norm_weight_decay),
                                          nxd_cfg, context)
        step = f"its learning-rate scheduler (model.optim.sched.name={optim.sched.name})"
        build.build_scheduler(optim, config.trainer.max_steps, optimizer)
    except Exception as exc:  # noqa: BLE001 - whatever stops this rank's build stops the run: refused
        raise RankBuildError(rank, layout_of(config, run).coords(rank), step, exc, config) from exc
    return model, context, nxd_cfg
