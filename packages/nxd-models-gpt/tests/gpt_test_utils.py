"""Shared pieces of the GPT tests: tiny HF GPT-2 / GPT-NeoX configs, the transformers oracle, comparisons.

The oracle is transformers' own ``GPT2LMHeadModel`` / ``GPTNeoXForCausalLM``, randomly initialised
(biases and norm weights too) and saved to disk (no download). Labels are aligned (label[t]
follows input[t]), so the HF loss is taken on its logits directly instead of through its shift.
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
from nxd_testing.reference import assert_parity, forward_backward_result, parity_errors, quiet_transformers, rel_err  # noqa: E402, F401

BATCH, SEQ = 2, 16
_NO_IDS = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
_GPT2 = dict(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
             attn_pdrop=0.0, **_NO_IDS)
_NEOX = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=64, **_NO_IDS)

#: name -> (HF family, transformers config kwargs)
CONFIGS: dict[str, tuple[str, dict]] = {
    "gpt2": ("gpt2", dict(_GPT2)),
    # 130 tokens: Megatron pads to 128*tp, the padding must never receive probability; untied head
    "gpt2_padded_untied": ("gpt2", dict(_GPT2, vocab_size=130, tie_word_embeddings=False, n_inner=96)),
    "neox": ("gpt_neox", dict(_NEOX, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                      "partial_rotary_factor": 0.25})),
    "neox_sequential_padded": ("gpt_neox", dict(_NEOX, vocab_size=100, use_parallel_residual=False,
                                                rope_parameters={"rope_type": "default", "rope_theta": 500.0,
                                                                 "partial_rotary_factor": 1.0})),
}


def vocab(name: str) -> int:
    return CONFIGS[name][1]["vocab_size"]


def hf_class(family: str):
    from transformers import GPT2LMHeadModel, GPTNeoXForCausalLM

    return GPT2LMHeadModel if family == "gpt2" else GPTNeoXForCausalLM


def make_hf_model(name: str, seed: int = 0):
    from transformers import GPT2Config, GPTNeoXConfig

    family, kwargs = CONFIGS[name]
    config = (GPT2Config if family == "gpt2" else GPTNeoXConfig)(**kwargs)
    torch.manual_seed(seed)
    model = hf_class(family)(config).float()
    with torch.no_grad():  # HF initialises biases to 0 and norms to 1: make them count
        for pname, p in model.named_parameters():
            if pname.endswith("bias"):
                p.normal_(0.0, 0.1)
            elif p.dim() == 1:
                p.normal_(1.0, 0.1)
    return model


def save_hf(name: str, out: Path, seed: int = 0) -> Path:
    make_hf_model(name, seed).save_pretrained(str(out))
    return out


def batch(vocab_size: int, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, vocab_size, (BATCH, SEQ), generator=g),
            "labels": torch.randint(0, vocab_size, (BATCH, SEQ), generator=g)}


def load_hf(hf_dir: Path):
    family = json.loads((Path(hf_dir) / "config.json").read_text())["model_type"]
    return hf_class(family).from_pretrained(str(hf_dir), dtype=torch.float32)


def hf_reference(hf_dir: Path, data: dict[str, torch.Tensor]) -> dict:
    """Logits, aligned-label loss and every parameter's grad of the HF model at ``hf_dir``."""
    model = load_hf(hf_dir)
    logits = model(data["input_ids"]).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), data["labels"].reshape(-1))
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    if model.config.model_type == "gpt_neox" and "lm_head.weight" in grads:  # stored as embed_out
        grads["embed_out.weight"] = grads.pop("lm_head.weight")
    return {"logits": logits.detach(), "loss": loss.detach(), "grads": grads}


def abs_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return (actual.double() - expected.double()).abs().max().item()


def compare(result: dict, ref: dict, tol: float = 1e-5) -> dict:
    """Assert logits, loss and grads agree within ``tol`` relative; return the worst errors."""
    errors = parity_errors(result, ref)
    worst = assert_parity(result, ref, tol)
    return {"worst_rel": worst, "logits_rel": errors["logits"],
            "logits_abs": abs_err(result["logits"], ref["logits"])}


def nxd_forward_backward(hf_dir: Path, data: dict[str, torch.Tensor], sequence_parallel: bool = False) -> dict:
    """Import ``hf_dir`` at the current TP degree, run forward + backward; return full logits
    (gathered over TP, padding dropped) and HF-named full grads (assembled on TP rank 0)."""
    from nxd_core_parallel.grads import allreduce_sequence_parallel_gradients
    from nxd_models_gpt import GPTConfig, GPTForCausalLM, collect_hf_state_dict, gather_vocab_logits, load_hf_checkpoint

    config = GPTConfig.from_dict(json.loads((Path(hf_dir) / "config.json").read_text()))
    model = parallelize_model(GPTForCausalLM(config), config={"sequence_parallel": sequence_parallel})
    load_hf_checkpoint(model, hf_dir)
    # norm/bias grads are partial per rank under SP (the optimizer wrapper all-reduces them)
    return forward_backward_result(model, data, gather_logits=lambda logits: gather_vocab_logits(model, logits),
                                   export_grads=collect_hf_state_dict,
                                   sync_grads=allreduce_sequence_parallel_gradients if sequence_parallel else None)


def parity_body(tp: int, cases: list[tuple[str, str, bool]], data: dict[str, dict]) -> dict | None:
    """On every rank: TP=``tp`` import + forward/backward per ``(name, hf_dir, sequence_parallel)``;
    rank 0 returns ``{(name, sp): result}``."""
    import torch.distributed as dist

    from nxd_core_parallel import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    results = {(name, sp): nxd_forward_backward(Path(d), data[name], sp) for name, d, sp in cases}
    parallel_state.destroy_model_parallel()
    return results if dist.get_rank() == 0 else None


def roundtrip_body(tp: int, hf_dir: str, out_dir: str, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Import at TP=``tp``, export to ``out_dir``, and greedily generate from ``prompt``."""
    from nxd_core_parallel import parallel_state
    from nxd_models_gpt import GPTConfig, GPTForCausalLM, generate, load_hf_checkpoint, save_hf_checkpoint

    distributed = tp > 1
    if distributed:
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    config = GPTConfig.from_dict(json.loads((Path(hf_dir) / "config.json").read_text()))
    model = parallelize_model(GPTForCausalLM(config))
    load_hf_checkpoint(model, hf_dir)
    save_hf_checkpoint(model, out_dir)
    tokens = generate(model, prompt, new_tokens)
    if distributed:
        parallel_state.destroy_model_parallel()
    return tokens


def hf_generate(hf_dir: Path, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    return load_hf(hf_dir).generate(prompt, max_new_tokens=new_tokens, do_sample=False,
                                    attention_mask=torch.ones_like(prompt), pad_token_id=0)


def assert_same_tensors(dir_a: Path, dir_b: Path) -> None:
    """Every tensor of the two HF checkpoints is byte-identical (same names, dtypes, shapes, bytes)."""
    from safetensors.torch import load_file

    a, b = load_file(str(Path(dir_a) / "model.safetensors")), load_file(str(Path(dir_b) / "model.safetensors"))
    assert set(a) == set(b), set(a) ^ set(b)
    for key in a:
        assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
        assert a[key].contiguous().view(torch.uint8).equal(b[key].contiguous().view(torch.uint8)), key


def pipeline_roundtrip_body(cases: list[tuple[str, str]]) -> None:
    """For each ``(hf_dir, out_dir)``: import at PP=2 (strict; each stage reads its layers) into
    zeroed weights, export at PP=2 (each stage's layers gathered to global rank 0)."""
    from nxd_core_parallel import parallel_state
    from nxd_models_gpt import GPTConfig, GPTForCausalLM, load_hf_checkpoint, save_hf_checkpoint
    from nxd_pipeline import NxDPPModel

    parallel_state.initialize_model_parallel(1, 2)
    for hf_dir, out_dir in cases:
        config = GPTConfig.from_dict(json.loads((Path(hf_dir) / "config.json").read_text()))
        model = NxDPPModel(parallelize_model(GPTForCausalLM(config)), 2, {"num_microbatches": 1, "schedule": "1f1b"})
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
        load_hf_checkpoint(model, hf_dir)
        save_hf_checkpoint(model, out_dir)
    parallel_state.destroy_model_parallel()
