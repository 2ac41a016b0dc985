"""A matrix cell as the YAML config a user writes for it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from axes import data_parallel_size, model_parallel

STEPS = 2  # checkpoints after steps 1 and 2; the resumed run redoes step 2 from the step-1 checkpoint
LORA = {"lora_rank": 4, "lora_alpha": 8, "lora_dropout": 0.0, "save_lora_base": True}


@dataclass(frozen=True)
class Inputs:
    corpus: Mapping[str, str]
    sft_file: str
    pairs_file: str
    hf_folder: Path
    nxd_checkpoint: Path | None  # only for start == "nxd"


def layout(cell: Mapping[str, str], *, reshard: bool = False) -> dict[str, int]:
    """Ranks per dimension; ``reshard`` gives the other layout the resumed run uses: the
    model-parallel dimension folded into data parallelism (TP/PP/CP/EP=2 -> 1), or DP 2 -> 1."""
    sizes = {**model_parallel(cell), "ep": 2 if cell["expert_parallel"] == "ep2" else 1,
             "dp": data_parallel_size(cell)}
    if reshard:
        folded = next((k for k in ("tp", "pp", "cp", "ep") if sizes[k] > 1), None)
        if folded:
            sizes[folded] = 1
        else:
            sizes["dp"] //= 2
    return sizes


def config(cell: Mapping[str, str], inputs: Inputs, log_dir: Path, *, reshard: bool = False) -> dict[str, Any]:
    sizes = layout(cell, reshard=reshard)
    world = sizes["tp"] * sizes["pp"] * sizes["cp"] * sizes["dp"]
    micro_batches = 2 if sizes["pp"] > 1 else 1
    strategy: dict[str, Any] = {"tensor_model_parallel_size": sizes["tp"], "pipeline_model_parallel_size": sizes["pp"],
                                "context_parallel_size": sizes["cp"], "expert_model_parallel_size": sizes["ep"],
                                "sequence_parallel": sizes["tp"] > 1}
    if cell["data_parallel"] == "zero1":
        strategy["zero1"] = True
    elif cell["data_parallel"] == "fsdp":
        strategy["fsdp"] = True
    elif cell["data_parallel"] == "hsdp":
        strategy["fsdp"] = {"replicate_degree": 2} if sizes["dp"] >= 4 else True
    model: dict[str, Any] = {"architecture": cell["family"], "optim": {"name": "adamw", "lr": 1e-2, "sched": {"name": "constant"}}}
    exp: dict[str, Any] = {"explicit_log_dir": str(log_dir), "create_tensorboard_logger": False,
                           "checkpoint_callback_params": {"every_n_train_steps": 1, "save_top_k": STEPS}}
    if cell["start"] == "hf":
        model["pretrained_checkpoint"] = str(inputs.hf_folder)
    else:
        model["model_config"] = str(inputs.hf_folder / "config.json")
        if cell["start"] == "nxd":
            exp["resume_from_checkpoint"] = str(inputs.nxd_checkpoint)
            model["weight_init_only"] = True
    data: dict[str, Any] = {"micro_batch_size": 1, "global_batch_size": sizes["dp"] * micro_batches, "seq_length": 32,
                            "tokenizer": inputs.corpus["tokenizer"]}
    alignment: dict[str, Any] = {}
    workflow = cell["workflow"]
    if workflow == "pretrain":
        data.update(module="indexed", data_prefix=inputs.corpus["data_prefix"], splits_string="950,50,0")
    elif workflow == "sft":
        data["train_dir"] = inputs.sft_file
        alignment["sft"] = {"packing": True}
    else:
        data["train_dir"] = inputs.pairs_file
        alignment[workflow] = {"max_prompt_length": 16, **({"kl_beta": 0.1} if workflow == "dpo" else {})}
    if cell["adapter"] == "lora":
        alignment["peft"] = dict(LORA)
    precision: dict[str, Any] = {"fp32": {"type": "fp32"}, "bf16": {"type": "autocast"},
                                 "fp8": {"type": "fp8", "fp8": {"emulate": True}}}[cell["precision"]]
    out: dict[str, Any] = {
        "name": "cell", "seed": 7,
        "trainer": {"devices": world, "num_nodes": 1, "max_steps": STEPS, "log_every_n_steps": 1, "val_check_interval": 0,
                    "limit_val_batches": 1, "enable_progress_bar": False, "accelerator": "cpu"},
        "exp_manager": exp, "distributed_strategy": strategy, "data": data, "model": model, "precision": precision,
    }
    if alignment:
        out["model_alignment_strategy"] = alignment
    return out


def cell_id(cell: Mapping[str, str]) -> str:
    return "-".join(cell.values())
