"""QLoRA + FSDP: the NF4 base (torchao's ``NF4Tensor``) sharded by ``fully_shard`` with its scales,
adapters trained, on 2 gloo ranks against the one-process QLoRA model (losses and adapters within
1e-5 after AdamW steps; the one-process QLoRA equals a dequantised reference: nxd-lora's
tests/test_qlora.py). Checkpoint state leaves the NF4 base out on both sides."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from fsdp_models import LR, MAX_NORM, full_params, params_rel
from torch.distributed.tensor import DTensor

import nxd
import nxd_fsdp
from nxd_testing.reference import max_rel, token_chain_batch, train_reference
from nxd_testing.tiny_tp_lm import TinyDims, TinyLM

pytest.importorskip("torchao.quantization.quantize_.workflows.nf4.nf4_tensor")

STEPS = 3
#: every base weight a whole number of NF4 scaler blocks (64 x 256 elements) per FSDP shard at DP=2
DIMS = TinyDims(vocab=32, hidden=256, heads=4, kv_heads=1, ffn=256, bias=True)
LORA = dict(enable_lora=True, lora_rank=2, lora_alpha=4.0, target_modules=["qkv", "o_proj", "up", "down"],
            init_lora_weights="gaussian", quantize_base="nf4")


def qlora_model():
    from nxd_lora import LoraConfig, LoRAModel

    torch.manual_seed(1234)
    return LoRAModel(TinyLM(DIMS, False), LoraConfig(**LORA))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    return token_chain_batch(step, batch=4, seq=8, vocab=DIMS.vocab, mult=5, add=3)


def body() -> tuple[list[float], dict | None, dict]:
    from nxd_lora.quantize import is_nf4

    cfg = nxd.neuronx_distributed_config(optimizer_config={"grad_clipping": True, "max_grad_norm": MAX_NORM},
                                         fsdp_config=True)
    ctx = nxd.get_parallel_context()
    model = nxd_fsdp.shard(qlora_model(), ctx, cfg)
    nf4 = [p for p in model.parameters() if is_nf4(p)]
    layout = {"nf4 shards": sum(isinstance(p, DTensor) and p.to_local().numel() * 2 == p.numel() for p in nf4),
              "nf4 trainable": sum(p.requires_grad for p in nf4)}
    opt = nxd_fsdp.make_optimizer(cfg, torch.optim.AdamW, [p for p in model.parameters() if p.requires_grad],
                                  context=ctx, lr=LR)
    losses = []
    for step in range(STEPS):
        ids, labels = batch(step)
        per = ids.shape[0] // ctx.dp.size
        rows = slice(ctx.dp.rank * per, (ctx.dp.rank + 1) * per)
        loss = model.run_train(ids[rows], labels[rows]).float().clone()
        opt.step()
        opt.zero_grad()
        dist.all_reduce(loss)
        losses.append(float(loss) / ctx.dp.size)
    params = full_params(model)
    return losses, params if ctx.rank == 0 else None, layout


def test_qlora_fsdp_dp2_matches_one_process(rank_pool):
    model = qlora_model()
    trainable = [p for p in model.parameters() if p.requires_grad]
    ref = train_reference(model, torch.optim.AdamW(trainable, lr=LR), [batch(s) for s in range(STEPS)],
                          max_norm=MAX_NORM)
    ref_state = {k: v.detach() for k, v in model.state_dict().items()}
    losses, params, layout = rank_pool(2).run(body)[0]
    assert layout == {"nf4 shards": 8, "nf4 trainable": 0}, layout  # 2 blocks x 4 NF4 weights, each cut in half
    assert not any(k.endswith(("qkv.weight_qkv", "o_proj.weight", "up.weight", "down.weight")) for k in params)
    worst = max(max_rel(losses, ref.losses), params_rel(params, ref_state))
    print(f"QLoRA + FSDP DP=2: max rel diff (losses, trained state after {STEPS} steps) {worst:.2e}")
    assert worst < 1e-5
