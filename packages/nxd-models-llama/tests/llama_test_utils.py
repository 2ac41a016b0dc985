"""Shared pieces of the Llama tests: tiny HF configs, the HF oracle, comparisons.

The oracle is transformers' own ``LlamaForCausalLM``, randomly initialised and saved to disk (no
download). Labels are aligned (label[t] follows input[t]), so the HF loss is taken on its logits
directly instead of through its internal shift.
"""

from __future__ import annotations

import os
from pathlib import Path

from nxd.transforms import parallelize_model

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# nxd-testing's shared oracle helpers, re-exported to this package's tests
from nxd_testing.reference import assert_parity as compare  # noqa: E402, F401
from nxd_testing.reference import forward_backward_result, quiet_transformers, rel_err  # noqa: E402, F401

VOCAB = 128
BATCH, SEQ = 2, 16

_BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=4, max_position_embeddings=256, rms_norm_eps=1e-5, initializer_range=0.1,
             bos_token_id=None, eos_token_id=None, pad_token_id=None)
_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8}

#: name -> transformers.LlamaConfig kwargs
CONFIGS: dict[str, dict] = {
    "mha": dict(_BASE),
    "gqa": dict(_BASE, num_key_value_heads=2),
    "mqa": dict(_BASE, num_key_value_heads=1),
    "llama3_rope": dict(_BASE, num_key_value_heads=2, rope_theta=500000.0, rope_scaling=dict(_LLAMA3_ROPE)),
    # vocabularies not divisible by TP (padded inside, invisible in logits, loss, export, generation)
    "tied": dict(_BASE, vocab_size=127, num_key_value_heads=2, tie_word_embeddings=True),
    # odd sizes (heads of 8, 6 of them, 3 per TP=2 rank) and every optional bias
    "odd": dict(_BASE, vocab_size=101, hidden_size=48, intermediate_size=74, num_attention_heads=6,
                num_key_value_heads=2, attention_bias=True, mlp_bias=True),
}


def make_hf_model(name: str, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**CONFIGS[name])).float()
    if CONFIGS[name].get("attention_bias") or CONFIGS[name].get("mlp_bias"):
        with torch.no_grad():  # HF zero-initialises biases; make them count
            for pname, p in model.named_parameters():
                if pname.endswith("bias"):
                    p.normal_(0.0, 0.1)
    return model


def save_hf(name: str, out: Path, max_shard_size: str | None = None, seed: int = 0) -> Path:
    model = make_hf_model(name, seed)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(str(out), **kwargs)
    return out


def batch(vocab: int = VOCAB, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, vocab, (BATCH, SEQ), generator=g),
            "labels": torch.randint(0, vocab, (BATCH, SEQ), generator=g)}


def hf_reference(hf_dir: Path, data: dict[str, torch.Tensor]) -> dict:
    """Logits, aligned-label loss and every parameter's grad of the HF model at ``hf_dir``."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    logits = model(data["input_ids"]).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), data["labels"].reshape(-1))
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    if model.config.tie_word_embeddings:
        grads.pop("lm_head.weight", None)
    return {"logits": logits.detach(), "loss": loss.detach(), "grads": grads}


def nxd_forward_backward(hf_dir: Path, data: dict[str, torch.Tensor], sequence_parallel: bool = False) -> dict:
    """Import ``hf_dir`` into nxd at the current TP degree, run forward + backward, and return
    full logits (gathered over TP) and HF-named full grads (assembled on TP rank 0)."""
    import json

    from nxd_core_parallel.grads import allreduce_sequence_parallel_gradients
    from nxd_models_llama import (
        LlamaConfig,
        LlamaForCausalLM,
        collect_hf_state_dict,
        gather_vocab_logits,
        load_hf_checkpoint,
    )

    config = LlamaConfig.from_dict(json.loads((Path(hf_dir) / "config.json").read_text()))
    model = parallelize_model(LlamaForCausalLM(config), config={"sequence_parallel": sequence_parallel})
    load_hf_checkpoint(model, hf_dir)
    # norm grads are partial per rank under SP (the optimizer wrapper all-reduces them)
    return forward_backward_result(model, data, gather_logits=lambda logits: gather_vocab_logits(logits, config.vocab_size),
                                   export_grads=collect_hf_state_dict,
                                   sync_grads=allreduce_sequence_parallel_gradients if sequence_parallel else None)


def parity_body(tp: int, cases: list[tuple[str, str, bool]], data: dict[str, dict]) -> dict | None:
    """On every rank: TP=``tp`` import + forward/backward for each ``(name, hf_dir, sequence_parallel)``;
    rank 0 returns ``{(name, sp): result}``."""
    import torch.distributed as dist

    from nxd_core_parallel import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    results = {(name, sp): nxd_forward_backward(Path(d), data[name], sp) for name, d, sp in cases}
    return results if dist.get_rank() == 0 else None


def roundtrip_body(tp: int, hf_dir: str, out_dir: str, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Import at TP=``tp``, export to ``out_dir``, and greedily generate from ``prompt``."""
    import json

    from nxd_core_parallel import parallel_state
    from nxd_models_llama import LlamaConfig, LlamaForCausalLM, generate, load_hf_checkpoint, save_hf_checkpoint

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    config = LlamaConfig.from_dict(json.loads((Path(hf_dir) / "config.json").read_text()))
    model = parallelize_model(LlamaForCausalLM(config))
    load_hf_checkpoint(model, hf_dir)
    save_hf_checkpoint(model, out_dir)
    return generate(model, prompt, new_tokens)


def hf_generate(hf_dir: Path, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(hf_dir))
    return model.generate(prompt, max_new_tokens=new_tokens, do_sample=False)


def assert_same_tensors(dir_a: Path, dir_b: Path) -> None:
    """Every tensor of the two HF checkpoints is byte-identical (same names, dtypes, shapes, bytes)."""
    from safetensors.torch import load_file

    def load(d: Path) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for f in sorted(Path(d).glob("*.safetensors")):
            out.update(load_file(str(f)))
        return out

    a, b = load(dir_a), load(dir_b)
    assert set(a) == set(b), set(a) ^ set(b)
    for key in a:
        assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
        assert a[key].contiguous().view(torch.uint8).equal(b[key].contiguous().view(torch.uint8)), key


def assert_exported_logits_equal(exported: Path, original: Path, data: dict[str, torch.Tensor]) -> None:
    """transformers reads the export's config.json as the original's and computes the same logits."""
    from transformers import LlamaForCausalLM

    from nxd_testing.reference import assert_config_preserved

    assert_config_preserved(original, exported)

    ids = data["input_ids"]
    a = LlamaForCausalLM.from_pretrained(str(exported))(ids).logits
    b = LlamaForCausalLM.from_pretrained(str(original))(ids).logits
    assert torch.equal(a, b)
