"""Shared pieces of the Mixtral tests: a tiny HF Mixtral as the oracle, HF-named grads, comparisons.

The oracle is transformers' ``MixtralForCausalLM`` (randomly initialised, saved to a temporary
directory). Labels are aligned (label[t] follows input[t]); the reference loss is cross-entropy on
HF's logits plus ``router_aux_loss_coef`` x HF's own ``aux_loss`` (``output_router_logits=True``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from nxd.transforms import parallelize_model

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# nxd-testing's shared oracle helpers, re-exported to this package's tests
from nxd_testing.reference import assert_parity as compare  # noqa: E402, F401
from nxd_testing.reference import (  # noqa: E402, F401
    checkpoint_named_grads,
    forward_backward_result,
    quiet_transformers,
    random_lm_batch,
    rel_err,
    save_hf_oracle,
)

VOCAB, BATCH, SEQ = 128, 2, 16
CONFIG = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, initializer_range=0.1,
              num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.02, output_router_logits=True,
              bos_token_id=None, eos_token_id=None, pad_token_id=None)


def save_hf(out: Path, seed: int = 0, **overrides) -> Path:
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(seed)
    return save_hf_oracle(MixtralForCausalLM(MixtralConfig(**{**CONFIG, **overrides})).float(), out)


def batch(seed: int = 1, batch_size: int = BATCH) -> dict[str, torch.Tensor]:
    return random_lm_batch(seed, batch_size, SEQ, VOCAB)


def hf_named_grads(model) -> dict[str, torch.Tensor]:
    """transformers 5 keeps experts stacked in memory; name its grads as the checkpoint does."""
    return checkpoint_named_grads(model, ("w1", "w3", "w2"), "block_sparse_moe")


def hf_reference(hf_dir: Path, data: dict[str, torch.Tensor]) -> dict:
    from transformers import MixtralForCausalLM

    model = MixtralForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    out = model(data["input_ids"], output_router_logits=True)
    ce = F.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]), data["labels"].reshape(-1))
    loss = ce + model.config.router_aux_loss_coef * out.aux_loss
    loss.backward()
    return {"logits": out.logits.detach(), "loss": loss.detach(), "aux_loss": out.aux_loss.detach(),
            "grads": hf_named_grads(model)}


def nxd_forward_backward(hf_dir: str, data: dict[str, torch.Tensor], sequence_parallel: bool = False) -> dict:
    """Import into nxd at the current TP/EP degrees, forward + backward; full logits (gathered over
    TP) and HF-named full grads (gathered over TP and EP, on global rank 0)."""
    from nxd_core_parallel.grads import allreduce_sequence_parallel_gradients
    from nxd_models_llama import gather_vocab_logits
    from nxd_models_mixtral import MixtralConfig, MixtralForCausalLM, collect_hf_state_dict, load_hf_checkpoint

    config = MixtralConfig.from_dict(json.loads((Path(hf_dir) / "config.json").read_text()))
    model = parallelize_model(MixtralForCausalLM(config), config={"sequence_parallel": sequence_parallel})
    load_hf_checkpoint(model, hf_dir)
    return forward_backward_result(model, data, gather_logits=gather_vocab_logits, export_grads=collect_hf_state_dict,
                                   sync_grads=allreduce_sequence_parallel_gradients if sequence_parallel else None)


def lm_loss(model, rows: dict[str, torch.Tensor]) -> torch.Tensor:
    """``loss_of`` for ``nxd_testing.reference.train_data_parallel``: the model's own LM loss."""
    return model(rows["input_ids"], labels=rows["labels"]).loss
