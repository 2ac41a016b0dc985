"""QLoRA (``LoraConfig.quantize_base='nf4'``), single process: the NF4 base equals a plain Linear
holding the same dequantised weights, adapters train, the base takes ~0.5 byte per parameter, and
the exported adapter loads with PEFT onto the dequantised base."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from nxd.errors import ConfigError
from nxd_lora import LoraConfig, LoRAModel, save_adapter

nf4_tensor = pytest.importorskip("torchao.quantization.quantize_.workflows.nf4.nf4_tensor")
NF4Tensor = nf4_tensor.NF4Tensor

H = 128  # 128 x 128 = 16384 = one NF4 scaler block of 256 blocks of 64


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj, self.up_proj, self.down_proj = nn.Linear(H, H), nn.Linear(H, 2 * H, bias=False), nn.Linear(2 * H, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down_proj(torch.tanh(self.up_proj(self.q_proj(x))))


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(), Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


TARGETS = ["q_proj", "up_proj", "down_proj"]


def _cfg(**kw) -> LoraConfig:
    return LoraConfig(**{"lora_rank": 4, "lora_alpha": 8.0, "target_modules": TARGETS, **kw})


def _qlora_and_reference() -> tuple[LoRAModel, LoRAModel, Toy]:
    torch.manual_seed(0)
    base = Toy()
    q = LoRAModel(copy.deepcopy(base), _cfg(quantize_base="nf4"))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in q.lora_layers.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    deq = copy.deepcopy(base)  # the same NF4 values, dequantised into plain Linear layers
    with torch.no_grad():
        for name, mod in q.module.named_modules():
            if isinstance(getattr(mod, "weight", None), NF4Tensor):
                deq.get_submodule(name).weight.copy_(mod.weight.get_original_weight())
    plain = copy.deepcopy(deq)
    ref = LoRAModel(deq, _cfg())
    ref.lora_layers.load_state_dict(q.lora_layers.state_dict())
    return q, ref, plain


def test_nf4_forward_and_adapter_grads_equal_dequantised_reference():
    q, ref, _ = _qlora_and_reference()
    weights = [m.weight for m in q.module.modules() if isinstance(m, nn.Linear)]
    assert len(weights) == 6 and all(isinstance(w, NF4Tensor) and not w.requires_grad for w in weights)
    x = torch.randn(3, 5, H)
    out_q, out_r = q(x), ref(x)
    assert (out_q - out_r).abs().max() <= 1e-5 * out_r.abs().max()
    out_q.square().mean().backward()
    out_r.square().mean().backward()
    trainable = [n for n, p in q.named_parameters() if p.requires_grad]
    assert trainable and all(n.startswith("lora_layers.") for n in trainable)
    ref_params = dict(ref.lora_layers.named_parameters())
    for n, p in q.lora_layers.named_parameters():
        g_r = ref_params[n].grad
        assert (p.grad - g_r).abs().max() <= 1e-5 * g_r.abs().max(), n


def test_nf4_base_bytes_per_parameter():
    q, _, _ = _qlora_and_reference()
    weights = [m.weight for m in q.module.modules() if isinstance(m, nn.Linear)]
    from nxd_lora.quantize import nf4_bytes

    per_param = sum(nf4_bytes(w) for w in weights) / sum(w.numel() for w in weights)
    print(f"NF4 base bytes/param: {per_param:.4f}")
    assert 0.5 < per_param < 0.52  # 0.5 (4-bit codes) + 1/64 (int8 scale per block) + scaler-block factors


def test_nf4_refusals_name_the_key():
    with pytest.raises(ConfigError, match="quantize_base"):
        LoraConfig(quantize_base="int4")
    with pytest.raises(ConfigError, match="quantize_base"):
        LoraConfig(quantize_base="nf4", save_lora_base=True)
    torch.manual_seed(0)
    odd = nn.Sequential(nn.Linear(H, 24))  # 3072 elements: not whole NF4 scaler blocks
    with pytest.raises(ConfigError, match=r"quantize_base='nf4'.*multiple of 16384"):
        LoRAModel(odd, _cfg(target_modules=["0"], quantize_base="nf4"))
    assert type(odd[0].weight) is nn.Parameter  # refused before anything was quantised

    class MyLinear(nn.Linear):
        pass

    with pytest.raises(ConfigError, match="not a linear layer QLoRA can quantise"):
        LoRAModel(nn.Sequential(MyLinear(H, H)), _cfg(target_modules=["0"], quantize_base="nf4"))
    q, _, _ = _qlora_and_reference()
    with pytest.raises(ConfigError, match="merge_lora"):
        q.merge_lora()


def test_nf4_adapter_export_loads_with_peft_on_dequantised_base(tmp_path):
    peft = pytest.importorskip("peft")
    q, _, plain = _qlora_and_reference()
    save_adapter(q, tmp_path)
    x = torch.randn(2, 3, H)
    peft_model = peft.PeftModel.from_pretrained(plain, str(tmp_path))
    with torch.no_grad():
        expect, got = q(x), peft_model(x)
    assert (got - expect).abs().max() <= 1e-5 * expect.abs().max()


LLAMA = {"vocab_size": 64, "hidden_size": 128, "intermediate_size": 128, "num_hidden_layers": 1,
         "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 16}
LLAMA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _llama():
    from nxd.transforms import parallelize_model
    from nxd_models_llama import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)  # TP=1: the plan swaps in nxd's parallel layers holding the whole weights
    return parallelize_model(LlamaForCausalLM(LlamaConfig.from_dict(LLAMA)))


def test_nf4_on_nxd_parallel_layers_at_tp1_and_state_without_base():
    from nxd_lora.quantize import dequantize_nf4_

    cfg = dict(lora_rank=4, lora_alpha=8.0, target_modules=LLAMA_TARGETS)
    q = LoRAModel(_llama(), LoraConfig(**cfg, quantize_base="nf4"))
    kinds = {type(m).__name__ for m in q.module.modules()
             if any(isinstance(p, NF4Tensor) for p in m.parameters(recurse=False))}
    assert kinds == {"GQAQKVColumnParallelLinear", "ColumnParallelLinear", "RowParallelLinear"}, kinds
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in q.lora_layers.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    ref_base = _llama()  # the same NF4 values, dequantised into the plain layers
    with torch.no_grad():
        for name, p in q.module.named_parameters():
            if isinstance(p, NF4Tensor):
                ref_base.get_parameter(name).copy_(p.get_original_weight())
    ref = LoRAModel(ref_base, LoraConfig(**cfg))
    ref.lora_layers.load_state_dict(q.lora_layers.state_dict())
    ids = torch.randint(0, 64, (2, 8), generator=g)
    out_q, out_r = q(input_ids=ids, labels=ids), ref(input_ids=ids, labels=ids)
    assert (out_q.logits - out_r.logits).abs().max() <= 1e-5 * out_r.logits.abs().max()
    out_q.loss.backward()
    out_r.loss.backward()
    ref_params = dict(ref.lora_layers.named_parameters())
    for n, p in q.lora_layers.named_parameters():
        assert (p.grad - ref_params[n].grad).abs().max() <= 1e-5 * ref_params[n].grad.abs().max(), n
    # the NF4 base is not state: saved and loaded without it (the run rebuilds it from the HF weights)
    state = q.state_dict()
    assert not any(isinstance(v, NF4Tensor) for v in state.values()) and any("lora_layers" in k for k in state)
    again = LoRAModel(_llama(), LoraConfig(**cfg, quantize_base="nf4"))
    assert again.load_state_dict(state, strict=True).missing_keys == []
    with torch.no_grad():
        assert torch.equal(again(input_ids=ids).logits, q(input_ids=ids).logits)
    assert dequantize_nf4_(q.module) == 4  # fused qkv, o, fused gate/up, down


def test_nf4_layouts_refused_before_launch():
    import nxd

    lora = LoraConfig(lora_rank=4, target_modules=LLAMA_TARGETS, quantize_base="nf4")
    with pytest.raises(ConfigError, match=r"quantize_base='nf4' with tensor_parallel_size=2: NF4 over TP shards"):
        nxd.neuronx_distributed_config(tensor_parallel_size=2, lora_config=lora)
    with pytest.raises(ConfigError, match="quantize_base='nf4' with meta_device_init"):
        nxd.neuronx_distributed_config(lora_config=lora, model_init_config={"meta_device_init": True,
                                                                            "param_init_fn": lambda module: None})
