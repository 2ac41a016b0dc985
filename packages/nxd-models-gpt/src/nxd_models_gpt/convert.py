"""``nxd ckpt convert --from megatron`` / ``--to megatron`` (entry points of nxd-ckpt's converter;
imported only by it, so nxd-ckpt is present whenever this runs)."""

from __future__ import annotations

from typing import Any

from nxd.transforms import parallelize_model
from nxd_models_gpt.config import GPTConfig
from nxd_models_gpt.megatron_ckpt import (
    config_from_megatron_args,
    load_megatron_checkpoint,
    rank_files,
    save_megatron_checkpoint,
)
from nxd_models_gpt.modeling import GPTForCausalLM
from nxd_models_gpt.safe_load import load_weights_only


def read_megatron(request: Any) -> Any:
    """A Megatron-LM / NeMo GPT checkpoint (``--input``) as a full nxd state. The model config is
    ``--config`` (Megatron or HF keys) or, without it, built from the checkpoint's ``args`` (the
    vocabulary is then the padded one Megatron stores)."""
    from nxd_ckpt import FullState

    config = request.config
    if config is None:
        first = sorted(rank_files(request.input).values())[0]
        config = config_from_megatron_args(load_weights_only(first).get("args"))
    # parallelised (one process): the vocabulary layers hold Megatron's padding, as every nxd GPT does
    model = parallelize_model(GPTForCausalLM(GPTConfig.from_dict(config)))
    load_megatron_checkpoint(model, request.input)
    return FullState({k: v.detach().clone() for k, v in model.state_dict().items()}, dict(config))


def write_megatron(full: Any, request: Any) -> None:
    """A full nxd GPT state as a Megatron-LM checkpoint (legacy layout, TP=1/PP=1 unless
    ``options`` name ``tp``/``pp``) under ``--output``."""
    config = request.config or full.config
    if config is None:
        raise ValueError("--to megatron needs the model config: pass --config config.json")
    options = request.options or {}
    save_megatron_checkpoint(dict(full.state), config, request.output, tp=int(options.get("tp", 1)),
                             pp=int(options.get("pp", 1)))
