"""One-process reference for NxD's BERT example (``tp_dp_bert_large_hf_pretrain_hdf5.py``):
transformers' ``BertForPreTraining`` holding the weights a TP run saved with
``checkpointing.save`` (its ranks' shards put together), and its loss on the batch the script
trains on first (the first shard file of epoch 0, the script's sampler). Run it through
``nxd-compat-run`` beside the example, one rank, so the example's own dataset code can be imported.

Usage: bert_reference.py CHECKPOINT_DIR MODEL_DIR DATA_DIR BATCH_SIZE MAX_PRED_LEN TP  -> prints the loss.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import random
import sys

import torch
import torch.distributed as dist

SCRIPT = "tp_dp_bert_large_hf_pretrain_hdf5.py"
SEED = 12349  # the example's default --seed


def shard_dim(name: str) -> int | None:
    """Which dimension the example's parallel layers split ``name`` along (None: replicated)."""
    if ".attention.self." in name:  # ColumnParallelLinear query/key/value: weight and bias by rows
        return 0
    if name.endswith(".attention.output.dense.weight"):  # RowParallelLinear: weight by columns
        return 1
    return None


def full_state(checkpoint_dir: str, tp: int) -> dict[str, torch.Tensor]:
    ranks = [torch.load(os.path.join(checkpoint_dir, f"tp_rank_{r:02d}_pp_rank_00", "checkpoint.pt"),
                        weights_only=False)["model"] for r in range(tp)]
    state = {}
    for name, first in ranks[0].items():
        dim = shard_dim(name)
        if dim is None:
            for rank, other in enumerate(ranks[1:], start=1):  # replicated: TP ranks must agree
                assert torch.equal(first, other[name]), f"{name} differs between TP rank 0 and {rank}"
            state[name] = first
        else:
            state[name] = torch.cat([r[name] for r in ranks], dim=dim)
    return state


def main(checkpoint_dir: str, model_dir: str, data_dir: str, batch_size: int, max_pred_len: int, tp: int) -> float:
    dist.init_process_group("xla")
    from transformers import BertConfig, BertForPreTraining

    from neuronx_distributed.parallel_layers import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    spec = importlib.util.spec_from_file_location("example", SCRIPT)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    model = BertForPreTraining(BertConfig.from_pretrained(model_dir))
    model.load_state_dict(full_state(checkpoint_dir, tp))
    model.train()
    files = sorted(glob.glob(os.path.expanduser(data_dir) + "/*_training_*.hdf5"))
    random.Random(0).shuffle(files)  # as the script orders them at epoch 0
    loader, _ = example.create_pretraining_dataset(files[0], max_pred_len, batch_size, example.WorkerInitObj(SEED))
    input_ids, segment_ids, input_mask, masked_lm_labels, next_sentence_labels = next(iter(loader))
    return model(input_ids=input_ids, attention_mask=input_mask, token_type_ids=segment_ids, labels=masked_lm_labels,
                 next_sentence_label=next_sentence_labels).loss.item()


if __name__ == "__main__":
    args = sys.argv[1:]
    print("REFERENCE_LOSS", json.dumps(main(args[0], args[1], args[2], int(args[3]), int(args[4]), int(args[5]))))
