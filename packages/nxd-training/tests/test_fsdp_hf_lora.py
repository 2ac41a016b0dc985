"""Hugging Face weights loaded into a model FSDP has already sharded (what ``nxd train`` does with
``model.pretrained_checkpoint`` + ``distributed_strategy.fsdp``), for the families' three mapping
kinds (Llama's, Mixtral's experts, GPT-2's) and the layouts 2 ranks hold: FSDP DP=2, HSDP (2
replicas of 1 shard), TP=2 x FSDP, EP=2 x FSDP; with LoRA the weights go under the adapters. The
oracle is transformers' logits. Under LoRA + FSDP the adapter export (PEFT on transformers), the
merged export and the adapter's reload are checked on the live sharded model, and merging for the
export leaves every shard bit-unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

PROMPT = torch.tensor([[5, 17, 99, 3, 120, 42, 7, 31, 64, 12, 2, 19]])
LORA = {"enable_lora": True, "lora_rank": 4, "lora_alpha": 8, "lora_dropout": 0.0,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}


def _llama(out: Path) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    LlamaForCausalLM(config).save_pretrained(out)
    return out


def _mixtral(out: Path) -> Path:
    from transformers import MixtralConfig, MixtralForCausalLM

    from nxd_testing.reference import save_hf_oracle

    torch.manual_seed(4)
    config = MixtralConfig(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                           num_local_experts=4, num_experts_per_tok=2)
    return save_hf_oracle(MixtralForCausalLM(config), out)


def _gpt2(out: Path) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(5)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=64))
    with torch.no_grad():  # HF starts biases at 0 and norms at 1: make them count
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.normal_(1.0 if "ln" in name else 0.0, 0.1)
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {"llama": _llama(root / "llama"), "mixtral": _mixtral(root / "mixtral"), "gpt": _gpt2(root / "gpt2")}


def _hf_logits(hf_dir: Path, adapter: Path | None = None) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter))
    with torch.no_grad():
        return model.eval()(PROMPT).logits


def _logits(model: Any, vocab: int, context: Any) -> torch.Tensor:
    from nxd_modeling.generation import gather_vocab_logits

    with torch.no_grad():
        logits = model.eval()(input_ids=PROMPT).logits  # no dropout (GPT-2's config has it)
    return gather_vocab_logits(logits, vocab, context.tp.group).float()


def _body(spec_name: str, hf_dir: str, tp: int, ep: int, fsdp: Any, lora: dict | None, out: str) -> dict[str, Any]:
    import json

    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    import nxd
    from nxd_core_parallel import parallel_state
    from nxd_core_parallel.dtensor import copy_whole_, local

    context = parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, expert_model_parallel_size=ep)
    if lora is not None:
        from nxd_lora import LoraConfig

        lora = LoraConfig(**lora)
    cfg = nxd.neuronx_distributed_config(tensor_parallel_size=tp, expert_parallel_size=ep,
                                         fsdp_config=fsdp, lora_config=lora)
    spec = nxd.get_model(spec_name)
    model_config = spec.config_from_dict(json.loads((Path(hf_dir) / "config.json").read_text()))
    model = nxd.initialize_parallel_model(cfg, nxd.parallel.bind_context(spec.build, context), False, model_config, cfg)
    assert any(isinstance(p, DTensor) for p in model.parameters())
    lora_model = None
    if lora is not None:
        from nxd_lora.checkpoint import unwrap_lora

        lora_model = unwrap_lora(model)
    # as the trainer does: the base (under the adapters) takes the folder's weights
    spec.load_hf(lora_model.module if lora_model is not None else model, hf_dir)
    vocab = model_config.vocab_size
    result: dict[str, Any] = {"logits": _logits(model, vocab, context)}
    if lora_model is None:
        return result if dist.get_rank() == 0 else {}
    from nxd_lora.checkpoint import save_base_model
    from nxd_lora.peft_format import load_adapter, save_adapter

    # trained-looking adapters: B is zero after init, so give every adapter tensor the same random
    # whole values on every rank (each rank keeps its shard)
    gen = torch.Generator().manual_seed(11)
    adapters = [p for n, p in lora_model.named_parameters() if n.rpartition(".")[2] in ("lora_A", "lora_B")]
    with torch.no_grad():
        for p in adapters:
            copy_whole_(p, 0.2 * torch.randn(p.shape, generator=gen))
    result["lora_logits"] = _logits(model, vocab, context)
    save_base_model(lora_model.module, Path(out) / "base", context)
    save_adapter(lora_model, Path(out) / "adapter")
    with torch.no_grad():
        before = {n: local(p).clone() for n, p in model.named_parameters()}
        lora_model.merge_lora()
        save_base_model(lora_model.module, Path(out) / "merged", context)
        lora_model.unmerge_lora()
        result["unchanged_after_merge"] = all(torch.equal(local(p), before[n]) for n, p in model.named_parameters())
        for p in adapters:  # the saved adapter loads back into the sharded adapters
            local(p).zero_()
    load_adapter(lora_model, Path(out) / "adapter")
    result["reloaded_logits"] = _logits(model, vocab, context)
    return result if dist.get_rank() == 0 else {}


CASES = [  # (family, TP, EP, fsdp_config, LoRA); the base under LoRA loads as without it
    ("llama", 1, 1, True, True),
    ("llama", 1, 1, {"replicate_degree": 2}, True),  # HSDP: 2 replicas x 1 shard (a 2-D mesh)
    ("llama", 2, 1, True, True),  # TP=2 x FSDP (DP=1)
    ("mixtral", 1, 2, True, False),  # EP=2: experts on their own (expert-DP) mesh, the rest on the DP mesh
    ("gpt", 1, 1, True, False),
]


@pytest.mark.parametrize("family, tp, ep, fsdp, lora", CASES,
                         ids=["llama-fsdp-lora", "llama-hsdp-lora", "llama-tp2-fsdp-lora", "mixtral-ep2-fsdp",
                              "gpt2-fsdp"])
def test_hf_weights_load_into_sharded_models(rank_pool, hf_dirs, tmp_path: Path, family: str, tp: int, ep: int,
                                             fsdp: Any, lora: bool) -> None:
    from nxd_testing.reference import rel_err

    hf_dir = hf_dirs[family]
    got = rank_pool(2).run(_body, family, str(hf_dir), tp, ep, fsdp, LORA if lora else None, str(tmp_path))[0]
    want = _hf_logits(hf_dir)
    errors = {"logits vs transformers": rel_err(got["logits"], want)}
    if lora:
        adapted = got["lora_logits"]
        assert rel_err(adapted, want) > 1e-2  # the adapters change the model
        errors["PEFT adapter export vs nxd"] = rel_err(_hf_logits(tmp_path / "base", tmp_path / "adapter"), adapted)
        errors["merged export vs nxd"] = rel_err(_hf_logits(tmp_path / "merged"), adapted)
        errors["adapter reloaded vs nxd"] = rel_err(got["reloaded_logits"], adapted)
        assert got["unchanged_after_merge"]
    print(f"HF in, {family} TP={tp} EP={ep} fsdp={fsdp} LoRA={lora}: " +
          ", ".join(f"{k} {v:.1e}" for k, v in errors.items()))
    assert max(errors.values()) < 1e-5, errors
