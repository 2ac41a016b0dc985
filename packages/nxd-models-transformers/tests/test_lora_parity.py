"""LoRA on transformers families nxd has no plugin for, against PEFT on the one-process transformers
model: an adapter PEFT writes (every Linear of the decoder layers, A and B non-zero) is loaded by
nxd-lora into the ``transformers`` spec's model as the trainer builds it, on 2 real gloo ranks (the
rank pool): TP=2 through the model's own TP plan (column, row, gathered and scattered layers carry
adapters), or DDP over DP=2 for GPT-OSS (no TP plan). Loss, gradient norm (of the adapters) and every
adapter gradient within 1e-5 relative (fp32).

QLoRA (``quantize_base="nf4"``) on this path: OLMo 2 at FSDP=2, the base quantised from the HF weights
as the trainer builds it, against PEFT on the same NF4 weights dequantised (the one-process reference
of torchtune's and PEFT's QLoRA), same bound."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from families import FAMILIES, TP_FAMILIES, save_family

from nxd_testing.reference import random_lm_batch

BATCH, SEQ, VOCAB = 4, 8, 64


def decoder_linear_names(hf_dir: str) -> list[str]:
    """The short names of every ``nn.Linear`` inside the model's decoder layers (PEFT's targets)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    return sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules()
                   if isinstance(m, torch.nn.Linear) and ".layers." in name})


def dequantised_nf4_(model: torch.nn.Module, targets: list[str]) -> None:
    """Each target Linear's weight replaced by its NF4 rounding (torchao's ``to_nf4``, nxd-lora's block
    sizes), dequantised: the base QLoRA trains against."""
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4

    from nxd_lora.quantize import NF4_BLOCK_SIZE, NF4_SCALER_BLOCK_SIZE

    with torch.no_grad():
        for name, m in model.named_modules():
            if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets and ".layers." in name:
                m.weight.copy_(to_nf4(m.weight.detach().contiguous(), NF4_BLOCK_SIZE, NF4_SCALER_BLOCK_SIZE)
                               .get_original_weight())


def peft_reference(hf_dir: str, adapter_dir: str, data: dict[str, torch.Tensor], shards: int,
                   nf4_targets: list[str] | None = None) -> dict:
    """PEFT on transformers: the mean over ``shards`` DP micro-batches of the aligned-label
    cross-entropy, backward once; adapter gradients under PEFT's file keys and their norm
    (``nf4_targets``: those layers' base weights NF4-rounded first)."""
    import peft
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    if nf4_targets:
        dequantised_nf4_(base, nf4_targets)
    model = peft.PeftModel.from_pretrained(base, adapter_dir, is_trainable=True)
    per = data["input_ids"].shape[0] // shards
    loss = 0.0
    for i in range(shards):
        logits = model(input_ids=data["input_ids"][i * per:(i + 1) * per]).logits
        loss = loss + F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                      data["labels"][i * per:(i + 1) * per].reshape(-1)) / shards
    loss.backward()
    grads = {n.replace(".default", ""): p.grad.detach().clone() for n, p in model.named_parameters()
             if p.grad is not None}
    norm = torch.sqrt(sum(g.double().pow(2).sum() for g in grads.values()))
    return {"loss": loss.detach(), "grads": grads, "norm": norm}


def lora_body(hf_dir: str, adapter_dir: str, data: dict[str, torch.Tensor], tp: int,
              qlora: bool = False) -> dict | None:
    """One rank: the trainer's build of the ``transformers`` spec at TP ``tp`` (DDP over the rest),
    the folder's weights under PEFT's adapter, one step on this rank's rows of ``data``. ``qlora``:
    FSDP2 over the DP ranks, the base quantised to NF4 from the folder's weights (loaded first, as
    nxd-training's ``model_builder`` does)."""
    import json

    import nxd
    from nxd_lora import LoraConfig
    from nxd_lora.checkpoint import unwrap_lora
    from nxd_testing.lora_reference import adapter_grads

    spec = nxd.get_model("transformers")
    lora_config = LoraConfig(enable_lora=True, load_lora_from_ckpt=True, lora_save_dir=adapter_dir,
                             quantize_base="nf4" if qlora else None)
    cfg = nxd.neuronx_distributed_config(tensor_parallel_size=tp, lora_config=lora_config,
                                         fsdp_config=True if qlora else None,
                                         optimizer_config={"grad_clipping": True, "max_grad_norm": 1e9})
    context = nxd.get_parallel_context()
    model_config = spec.config_from_dict(json.loads((Path(hf_dir) / "config.json").read_text()))
    build = nxd.parallel.bind_context(spec.build, context)

    def build_and_load(*args):
        model = build(*args)
        spec.load_hf(model, hf_dir)
        return model

    model = nxd.initialize_parallel_model(cfg, build_and_load if qlora else build, False, model_config, cfg)
    if not qlora:
        spec.load_hf(unwrap_lora(model).module, hf_dir)  # the base under the adapters, as model.pretrained_checkpoint loads
    opt = nxd.initialize_parallel_optimizer(cfg, torch.optim.SGD, [p for p in model.parameters() if p.requires_grad],
                                            lr=0.0)
    per = data["input_ids"].shape[0] // context.dp.size
    rows = {k: v[context.dp.rank * per:(context.dp.rank + 1) * per] for k, v in data.items()}
    loss = model.run_train(rows).detach().clone()
    opt.step()  # gradient sync and the clipping norm (nothing clipped), lr 0
    dist.all_reduce(loss, group=context.dp.group)
    lora = unwrap_lora(model)
    grads = adapter_grads(lora)
    if qlora:
        from nxd_lora.quantize import is_nf4

        assert sum(is_nf4(p) for p in lora.module.parameters()) == len(grads) // 2  # one NF4 base per adapter
    return {"loss": loss / context.dp.size, "norm": opt.grad_norm, "grads": grads} if dist.get_rank() == 0 else None


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, tuple[str, str]]:
    """family -> (HF folder, PEFT adapter over every decoder Linear)."""
    from nxd_testing.lora_reference import make_peft_adapter

    root = tmp_path_factory.mktemp("lora")
    out = {}
    for family in FAMILIES:
        hf = str(save_family(family, root / family))
        out[family] = (hf, str(make_peft_adapter(hf, root / f"{family}-peft", decoder_linear_names(hf))))
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_lora_matches_peft(rank_pool, folders, family):
    hf, adapter = folders[family]
    tp = 2 if family in TP_FAMILIES else 1
    data = random_lm_batch(9, BATCH, SEQ, VOCAB)
    result = rank_pool(2).run(lora_body, hf, adapter, data, tp)[0]
    check(family, "LoRA TP=2" if tp == 2 else "LoRA DP=2", result, peft_reference(hf, adapter, data, 2 // tp))


def test_qlora_fsdp2_matches_peft_on_the_dequantised_base(rank_pool, tmp_path):
    from nxd_testing.lora_reference import make_peft_adapter

    pytest.importorskip("torchao.quantization.quantize_.workflows.nf4.nf4_tensor")
    # every projection a whole number of NF4 scaler blocks (64 x 256 elements) per FSDP shard
    hf = str(save_family("olmo2", tmp_path / "olmo2", hidden_size=256, intermediate_size=512, head_dim=64))
    targets = decoder_linear_names(hf)
    adapter = str(make_peft_adapter(hf, tmp_path / "peft", targets))
    data = random_lm_batch(10, BATCH, SEQ, VOCAB)
    result = rank_pool(2).run(lora_body, hf, adapter, data, 1, True)[0]
    check("olmo2", "QLoRA FSDP=2", result, peft_reference(hf, adapter, data, 2, nf4_targets=targets))


def check(family: str, layout: str, result: dict, ref: dict) -> None:
    """test_parity's check (loss, grad norm, every adapter gradient within its 1e-5) against PEFT."""
    import test_parity

    test_parity.check(family, f"{layout} vs PEFT", result, ref)


def test_lora_on_replicated_kv_projections_is_refused(rank_pool, tmp_path):
    """1 K/V head at TP=2 (replicated on both ranks): LoRA on k_proj/v_proj is refused, naming why."""
    from nxd_testing.lora_reference import make_peft_adapter

    hf = str(save_family("granite", tmp_path / "granite", num_key_value_heads=1))
    adapter = str(make_peft_adapter(hf, tmp_path / "peft", ["k_proj", "v_proj"]))
    with pytest.raises(Exception, match="a K/V projection whose heads are replicated over TP"):
        rank_pool(2).run(lora_body, hf, adapter, random_lm_batch(9, BATCH, SEQ, VOCAB), 2)
