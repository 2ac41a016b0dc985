"""The axes a user combines, what makes a cell not a combination at all, and a cell's overrides.

A cell is one value per axis. ``allowed`` rules out only what is not a combination (expert
parallelism without experts, more ranks than the matrix runs, a resume "to another layout" with no
other layout); what nxd cannot honour is not ruled out here: those cells are expected to be refused
before launch (``REFUSED``) and the matrix checks they are.
"""

from __future__ import annotations

from collections.abc import Mapping

AXES: dict[str, list[str]] = {
    "family": ["llama", "qwen3", "qwen3_moe", "deepseek_v3", "mixtral", "gpt", "transformers"],
    "workflow": ["pretrain", "sft", "dpo", "orpo"],
    "data_parallel": ["ddp", "zero1", "fsdp", "hsdp"],
    "tensor_parallel": ["tp1", "tp2+sp"],
    "pipeline": ["pp1", "pp2"],
    "context_parallel": ["cp1", "cp2"],
    "expert_parallel": ["ep1", "ep2"],
    "precision": ["fp32", "bf16", "fp8"],
    "adapter": ["none", "lora"],
    "start": ["scratch", "hf", "nxd"],
    "resume": ["same", "reshard"],
}
MOE = ("qwen3_moe", "deepseek_v3", "mixtral")
MAX_RANKS = 4


def data_parallel_size(cell: Mapping[str, str]) -> int:
    return 4 if cell.get("data_parallel") == "hsdp" else 2


def model_parallel(cell: Mapping[str, str]) -> dict[str, int]:
    return {"tp": 2 if cell.get("tensor_parallel") == "tp2+sp" else 1,
            "pp": 2 if cell.get("pipeline") == "pp2" else 1,
            "cp": 2 if cell.get("context_parallel") == "cp2" else 1}


def world_size(cell: Mapping[str, str]) -> int:
    sizes = model_parallel(cell)
    return sizes["tp"] * sizes["pp"] * sizes["cp"] * data_parallel_size(cell)


def allowed(cell: Mapping[str, str]) -> bool:
    if cell.get("expert_parallel") == "ep2" and "family" in cell and cell["family"] not in MOE:
        return False  # expert parallelism needs experts
    known = all(k in cell for k in ("tensor_parallel", "pipeline", "context_parallel", "data_parallel"))
    sizes = model_parallel(cell)
    if known and world_size(cell) > MAX_RANKS:
        return False
    if sum(v > 1 for v in sizes.values()) + (cell.get("data_parallel") == "hsdp") > 1:
        return False  # partial cells too: two of these already need more than MAX_RANKS ranks
    return True


#: cells nxd refuses before launch, by the reason's text (matched against ``--validate``'s error)
REFUSED: list[tuple[dict[str, str], str]] = []


def refusal(cell: Mapping[str, str]) -> str | None:
    for pattern, reason in REFUSED:
        if all(cell.get(k) == v for k, v in pattern.items()):
            return reason
    return None
