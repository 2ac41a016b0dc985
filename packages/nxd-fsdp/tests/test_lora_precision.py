"""LoRA + FSDP (frozen base sharded, adapters trained), QLoRA + FSDP (the NF4 base, torchao's
``NF4Tensor``, sharded by ``fully_shard`` with its scales) and bf16 mixed precision with fp32
reduction, each on 2 gloo ranks against its single-process oracle (losses and trained state within
1e-5; the one-process QLoRA equals a dequantised reference: nxd-lora's tests/test_qlora.py).
Checkpoint state leaves the NF4 base out on both sides."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from fsdp_models import LR, MAX_NORM, batch, build, full_params, params_rel
from torch.distributed.tensor import DTensor

import nxd
import nxd_fsdp
from nxd_testing.reference import max_rel, train_reference
from nxd_testing.tiny_tp_lm import TinyDims, TinyLM

STEPS = 5
LORA = dict(enable_lora=True, lora_rank=2, lora_alpha=4.0, target_modules=["qkv", "o_proj", "up", "down"],
            init_lora_weights="gaussian")
#: QLoRA: every base weight a whole number of NF4 scaler blocks (64 x 256 elements) per FSDP shard at DP=2
QLORA_DIMS = TinyDims(vocab=32, hidden=256, heads=4, kv_heads=1, ffn=256, bias=True)
#: the NF4 weights' names (the frozen base checkpoints leave out)
NF4_WEIGHTS = ("qkv.weight_qkv", "o_proj.weight", "up.weight", "down.weight")


def base_model(quantize: str | None) -> torch.nn.Module:
    if quantize is None:
        return build()
    torch.manual_seed(1234)
    return TinyLM(QLORA_DIMS, False)


def lora_model(quantize: str | None = None):
    from nxd_lora import LoraConfig, LoRAModel

    return LoRAModel(base_model(quantize), LoraConfig(**LORA, quantize_base=quantize))


def rows(ctx, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids, labels = batch(step)
    per = ids.shape[0] // ctx.dp.size
    return ids[ctx.dp.rank * per:(ctx.dp.rank + 1) * per], labels[ctx.dp.rank * per:(ctx.dp.rank + 1) * per]


def run(model_fn, fsdp, steps: int = STEPS) -> tuple[list[float], dict | None, dict]:
    cfg = nxd.neuronx_distributed_config(optimizer_config={"grad_clipping": True, "max_grad_norm": MAX_NORM},
                                         fsdp_config=fsdp)
    ctx = nxd.get_parallel_context()
    model = nxd_fsdp.shard(model_fn(), ctx, cfg)
    kinds = {"frozen DTensor": sum(isinstance(p, DTensor) and not p.requires_grad for p in model.parameters()),
             "trainable DTensor": sum(isinstance(p, DTensor) and p.requires_grad for p in model.parameters()),
             "plain": sum(not isinstance(p, DTensor) for p in model.parameters())}
    opt = nxd_fsdp.make_optimizer(cfg, torch.optim.AdamW, [p for p in model.parameters() if p.requires_grad],
                                  context=ctx, lr=LR)
    losses = []
    for step in range(steps):
        loss = model.run_train(*rows(ctx, step)).float().clone()
        opt.step()
        opt.zero_grad()
        dist.all_reduce(loss)
        losses.append(float(loss) / ctx.dp.size)
    if any(getattr(m, "_nf4_keys", None) for m in model.modules()):
        from nxd_lora.quantize import is_nf4

        nf4 = [p for p in model.parameters() if is_nf4(p)]
        kinds["nf4 halves"] = sum(isinstance(p, DTensor) and p.to_local().numel() * 2 == p.numel() for p in nf4)
        kinds["nf4 trainable"] = sum(p.requires_grad for p in nf4)
    params = full_params(model)
    return losses, params if ctx.rank == 0 else None, kinds


def lora_body(quantize: str | None, steps: int):
    return run(lambda: lora_model(quantize), True, steps)


@pytest.mark.parametrize("quantize", [None, "nf4"], ids=["lora", "qlora"])
def test_lora_fsdp_dp2_matches_one_process(rank_pool, quantize):
    if quantize:
        pytest.importorskip("torchao.quantization.quantize_.workflows.nf4.nf4_tensor")
    steps = STEPS if quantize is None else 3  # NF4's per-call dequantisation makes QLoRA's steps dearer
    model = lora_model(quantize)
    trainable = [p for p in model.parameters() if p.requires_grad]
    ref = train_reference(model, torch.optim.AdamW(trainable, lr=LR), [batch(s) for s in range(steps)],
                          max_norm=MAX_NORM)
    ref_params = {k: v.detach() for k, v in model.state_dict().items()}
    losses, params, kinds = rank_pool(2).run(lora_body, quantize, steps)[0]
    assert kinds["frozen DTensor"] > 0 and kinds["trainable DTensor"] > 0 and kinds["plain"] == 0, kinds
    if quantize:
        # 2 blocks x 4 NF4 weights, each cut in half with its scales; the NF4 base is in no state dict
        assert (kinds["nf4 halves"], kinds["nf4 trainable"]) == (8, 0), kinds
        assert not any(k.endswith(NF4_WEIGHTS) for k in params) and not any(k.endswith(NF4_WEIGHTS) for k in ref_params)
    worst = max(max_rel(losses, ref.losses), params_rel(params, ref_params))
    print(f"{'QLoRA' if quantize else 'LoRA'} + FSDP DP=2: max rel diff (losses, params after {steps} steps) {worst:.2e}")
    assert worst < 1e-5
    base = base_model(quantize).state_dict()
    for name, value in params.items():  # the frozen base did not move, the adapters did
        if name.startswith("module."):
            assert torch.equal(value, base[name.removeprefix("module.")]), name
    init = lora_model(quantize).state_dict()
    assert any(not torch.equal(v, init[k]) for k, v in params.items() if "lora" in k)


# ---------------------------------------------------------------- bf16 compute, fp32 reduction
def bf16_reference(dp: int = 2) -> tuple[list[float], dict]:
    """Plain data parallelism with FSDP's precision recipe, emulated in one process: each DP rank's
    half batch runs forward/backward with the fp32 parameters cast to bf16, its bf16 gradients are
    upcast and averaged in fp32, and AdamW updates the fp32 parameters."""
    from torch.func import functional_call

    model = build()
    params = dict(model.named_parameters())
    opt = torch.optim.AdamW(params.values(), lr=LR)
    losses = []
    for step in range(STEPS):
        ids, labels = batch(step)
        total = 0.0
        for part_ids, part_labels in zip(ids.chunk(dp), labels.chunk(dp)):
            loss = functional_call(model, {k: p.to(torch.bfloat16) for k, p in params.items()}, (part_ids, part_labels))
            (loss.float() / dp).backward()
            total += float(loss.detach().float()) / dp
        torch.nn.utils.clip_grad_norm_(params.values(), MAX_NORM)
        opt.step()
        opt.zero_grad()
        losses.append(total)
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def bf16_body():
    return run(build, {"mixed_precision": {"param_dtype": "bf16", "reduce_dtype": "fp32"}})


def test_bf16_compute_fp32_reduce_matches_emulated_dp(rank_pool):
    ref_losses, ref_params = bf16_reference()
    fp32_losses = train_reference(build(), torch.optim.AdamW(build().parameters(), lr=LR),
                                  [batch(s) for s in range(STEPS)], max_norm=MAX_NORM).losses
    losses, params, _ = rank_pool(2).run(bf16_body)[0]
    assert all(p.dtype == torch.float32 for p in params.values())  # the sharded (master) params stay fp32
    worst = max(max_rel(losses, ref_losses), params_rel(params, ref_params))
    bf16_effect = max_rel(ref_losses, fp32_losses)
    print(f"bf16 params + fp32 reduce, FSDP DP=2: max rel diff vs emulated DP {worst:.2e} "
          f"(bf16 vs fp32 compute itself: {bf16_effect:.2e})")
    assert worst < 1e-5 and bf16_effect > 10 * worst
