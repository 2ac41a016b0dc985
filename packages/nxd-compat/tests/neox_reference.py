"""One-process reference for NxD's GPT-NeoX examples: the first-step loss of the model a TP=N run
holds, computed in one process (run it through ``nxd-compat-run`` beside the example, one rank).

Why not simply the example at TP=1: the examples build ``query_key_value`` as
``ColumnParallelLinear(stride=3)``. NxD initialises the full (master) weight and deals it to ranks
with ``create_local_weight``: the rows are cut into ``3 x TP`` pieces and rank ``r`` keeps pieces
``r, r + TP, r + 2 TP``. NeoX's rows are grouped per head (``[head][q|k|v][head_size]``), so those
pieces are not whole heads and each rank reads its rows as ``[local head][q|k|v]``: at TP=2 the model
is another function of the same seed than at TP=1 (NxD's own code does the same; nxd reproduces it).
The reference therefore is the one-process model whose QKV rows are the TP ranks' rows in rank order.

Usage: neox_reference.py EXAMPLE_SCRIPT DATA_DIR BATCH_SIZE TP  -> prints the loss (JSON).
"""

from __future__ import annotations

import importlib.util
import json
import sys

import torch
import torch.distributed as dist

QKV = ("query_key_value.weight", "query_key_value.bias")
SEED = 12349  # the examples' default --seed


def rows_as_ranks_hold(full: torch.Tensor, tp: int, stride: int) -> torch.Tensor:
    """``full``'s rows in the order TP ranks hold them after NxD's strided deal (rank 0's first)."""
    pieces = torch.split(full, full.size(0) // (tp * stride))
    return torch.cat([torch.cat(pieces[rank::tp]) for rank in range(tp)])


def main(script: str, data_dir: str, batch_size: int, tp: int) -> float:
    dist.init_process_group("xla")
    from transformers import set_seed

    from neuronx_distributed.parallel_layers import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    spec = importlib.util.spec_from_file_location("example", script)  # a file name with dots ("6.9b")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    set_seed(SEED)  # as the example's train_gpt_neox does before get_model()
    model = example.get_model()
    model.train()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(QKV):
                param.copy_(rows_as_ranks_hold(param, tp, stride=3))
    loader = example.create_pretraining_dataset(data_dir, batch_size, example.WorkerInitObj(SEED))
    batch = next(iter(loader))
    return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]).loss.item()


if __name__ == "__main__":
    print("REFERENCE_LOSS", json.dumps(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
