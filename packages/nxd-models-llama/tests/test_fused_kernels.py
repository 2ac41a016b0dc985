"""``fused_kernels`` (Liger-Kernel's Triton ops, CUDA only). Without a GPU (CI): the selection is
validated (unknown op, Liger-Kernel missing, fused cross-entropy at TP>1) with errors that say what
to do. On a GPU (``@pytest.mark.gpu``): each fused op alone, and all together, give the eager
model's loss and gradients (fp32 within 1e-5 relative; bf16 within 2e-2), and the fused
cross-entropy returns no logits."""

from __future__ import annotations

import pytest
import torch

from nxd.errors import ConfigError
from nxd_tensor_parallel.fused_kernels import FUSED_KERNEL_OPS, liger_available, validate_fused_kernels

CONFIG = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, initializer_range=0.1)


def test_unknown_op_is_refused_with_the_valid_names() -> None:
    with pytest.raises(ConfigError, match=r"unknown op\(s\) \['layer_norm'\]; valid: \['rms_norm'"):
        validate_fused_kernels(["rms_norm", "layer_norm"], "model.fused_kernels")


@pytest.mark.skipif(liger_available(), reason="Liger-Kernel is installed here")
def test_missing_liger_names_the_package() -> None:
    from nxd_models_llama import LlamaConfig

    with pytest.raises(ConfigError, match="pip install liger-kernel"):
        LlamaConfig.from_dict({**CONFIG, "fused_kernels": ["rms_norm"]})
    assert LlamaConfig.from_dict(dict(CONFIG)).fused_kernels == ()  # nothing selected needs nothing


def _loss_and_grads(fused: tuple[str, ...], dtype: str, state: dict | None) -> tuple[torch.Tensor, dict, dict, object]:
    import nxd
    from nxd_models_llama import LlamaConfig
    from nxd_models_llama.spec import build

    config = LlamaConfig.from_dict({**CONFIG, "dtype": dtype, "fused_kernels": fused})
    nxd_config = nxd.neuronx_distributed_config()
    torch.manual_seed(0)
    model = nxd.initialize_parallel_model(nxd_config, build, False, config, nxd_config).cuda()
    if state is not None:
        model.load_state_dict(state)
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(0, CONFIG["vocab_size"], (2, 32), generator=generator).cuda()
    labels = ids.clone()
    labels[0, :5] = -100  # ignored tokens count zero in both paths
    out = model(input_ids=ids, labels=labels)
    out.loss.backward()
    grads = {n: p.grad.float() for n, p in model.named_parameters()}
    return out.loss.detach().float(), grads, {k: v.detach().clone() for k, v in model.state_dict().items()}, out


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-12))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (nox -s gpu on a GPU machine)")
@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("bfloat16", 2e-2)])
@pytest.mark.parametrize("ops", [(op,) for op in FUSED_KERNEL_OPS] + [FUSED_KERNEL_OPS], ids=lambda o: "+".join(o))
def test_fused_ops_match_eager(ops: tuple[str, ...], dtype: str, tol: float) -> None:
    ensure_process_group()
    loss, grads, state, _ = _loss_and_grads((), dtype, None)
    fused_loss, fused_grads, _, out = _loss_and_grads(ops, dtype, state)
    assert _rel(fused_loss, loss) <= tol
    worst = max(_rel(fused_grads[n], grads[n]) for n in grads)
    print(f"fused {'+'.join(ops)} {dtype}: loss rel {_rel(fused_loss, loss):.2e}, worst grad rel {worst:.2e}")
    assert worst <= tol, f"{ops} {dtype}: worst gradient rel diff {worst:.2e}"
    assert (out.logits is None) == ("cross_entropy" in ops)


def ensure_process_group() -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
