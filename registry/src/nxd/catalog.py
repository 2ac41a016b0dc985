"""Which distribution provides which component: the hint behind every "pip install ..." message.

Lists first-party plugins and known third-party ones. Add a third-party plugin here by pull
request; a component missing from the catalog still works once installed, the miss message is
just less specific.
"""

from __future__ import annotations

#: kind -> {component name -> distribution that provides it}
CATALOG: dict[str, dict[str, str]] = {
    "backend": {"cpu": "nxd-core-parallel", "cuda": "nxd-core-parallel", "accelerator": "nxd-core-parallel",
                "xla": "nxd-core-parallel"},
    "model": {"llama": "nxd-models-llama", "mistral": "nxd-models-llama", "gpt": "nxd-models-gpt", "mixtral": "nxd-models-mixtral"},
    "pipeline_schedule": {
        "gpipe": "nxd-pipeline",
        "1f1b": "nxd-pipeline",
        "interleaved_1f1b": "nxd-pipeline",
        "zero_bubble": "nxd-pipeline",
    },
    "optimizer": {"default": "nxd-core-parallel", "zero1": "nxd-zero1"},
    "model_transform": {
        "activation_checkpointing": "nxd-core-parallel",
        "compile": "nxd-core-parallel",
        "ddp": "nxd-core-parallel",
        "parallel_plan": "nxd-tensor-parallel",
        "pad_model": "nxd-tensor-parallel",
        "context_parallel": "nxd-context-parallel",
        "lora": "nxd-lora",
        "pipeline": "nxd-pipeline",
        "zero1": "nxd-zero1",
        "fsdp": "nxd-fsdp",
    },
    "adapter": {"lora": "nxd-lora"},
    "checkpoint_format": {"torch": "nxd-ckpt", "safetensors": "nxd-ckpt"},
    "storage": {"file": "nxd-ckpt", "s3": "nxd-ckpt"},
    "checkpointer": {"default": "nxd-ckpt"},
    "data_module": {"indexed": "nxd-data", "sft": "nxd-data", "hf": "nxd-data", "preference": "nxd-data"},
    "workflow": {"dpo": "nxd-alignment", "orpo": "nxd-alignment"},
    "checkpoint_converter": {"hf": "nxd-ckpt", "nxd": "nxd-ckpt", "full": "nxd-ckpt", "dcp": "nxd-ckpt",
                             "nnm": "nxd-migrate", "torchtitan": "nxd-torchtitan"},
    "command": {
        "train": "nxd-training",
        "plot": "nxd-training",
        "eval": "nxd-training",
        "generate": "nxd-training",
        "data": "nxd-data",
        "ckpt": "nxd-ckpt",
        "migrate": "nxd-migrate",
        "plugins": "nxd",
    },
}

#: Human words for each kind, used in messages ("pipeline schedule '1f1b'").
KIND_WORDS: dict[str, str] = {
    "backend": "device backend",
    "model": "model",
    "pipeline_schedule": "pipeline schedule",
    "optimizer": "optimizer",
    "model_transform": "model transform",
    "adapter": "adapter",
    "checkpoint_format": "checkpoint format",
    "storage": "checkpoint storage",
    "checkpointer": "checkpoint engine",
    "data_module": "data module",
    "workflow": "workflow",
    "checkpoint_converter": "checkpoint converter",
    "command": "command",
}


def provider_of(kind: str, name: str) -> str | None:
    """The distribution known to provide ``name`` of ``kind``, or ``None``."""
    return CATALOG.get(kind, {}).get(name)
