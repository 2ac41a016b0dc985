"""``compile_config`` (torch.compile per transformer block, inductor on CPU): the compiled tiny
Llama's loss and gradients match eager within fp32 tolerance at TP=1 and TP=2 (2 gloo ranks),
with and without activation checkpointing; parameter names stay those of the eager model."""

from __future__ import annotations

import time

import pytest
import torch

TOL = 1e-5
CONFIG = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5)


def compile_body(tp: int, checkpointing: str | None) -> dict:
    """Eager and compiled builds of one tiny Llama (same weights) on one batch: worst relative error
    of the loss and of every gradient, the step times, and whether each block was compiled."""
    import nxd
    from nxd_models_llama import LlamaConfig, LlamaDecoderLayer
    from nxd_models_llama.spec import build

    config = LlamaConfig.from_dict(dict(CONFIG))
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, CONFIG["vocab_size"], (2, 16), generator=generator)
    runs, state = {}, None
    for compiled in (False, True):
        nxd_config = nxd.neuronx_distributed_config(tensor_parallel_size=tp, compile_config=compiled,
                                                    activation_checkpoint_config=checkpointing)
        torch.manual_seed(0)
        model = nxd.initialize_parallel_model(nxd_config, build, False, config, nxd_config)
        if state is None:
            state = {k: v.clone() for k, v in model.state_dict().items()}
        else:
            model.load_state_dict(state)  # same names: compiling in place adds no _orig_mod prefix
        times = []
        for _ in range(2):  # the first compiled call compiles; the second is the steady state
            model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            loss = model(ids, labels=ids).loss
            loss.backward()
            times.append(time.perf_counter() - t0)
        blocks = [m for m in model.modules() if isinstance(m, LlamaDecoderLayer)]
        runs[compiled] = {"loss": loss.detach(), "times": times,
                          "grads": {n: p.grad.detach().clone() for n, p in model.named_parameters()},
                          "compiled_blocks": sum(m._compiled_call_impl is not None for m in blocks),
                          "blocks": len(blocks)}
    eager, comp = runs[False], runs[True]
    loss_err = float((comp["loss"] - eager["loss"]).abs() / eager["loss"].abs())
    grad_err = max(float((comp["grads"][n] - g).norm() / g.norm().clamp_min(1e-30)) for n, g in eager["grads"].items())
    return {"loss": loss_err, "grad": grad_err, "eager_s": eager["times"], "compiled_s": comp["times"],
            "compiled_blocks": comp["compiled_blocks"], "eager_compiled_blocks": eager["compiled_blocks"],
            "blocks": comp["blocks"], "same_names": set(comp["grads"]) == set(eager["grads"])}


@pytest.mark.slow
@pytest.mark.parametrize("tp,checkpointing", [(1, None), (2, "full")], ids=["tp1", "tp2-actckpt"])
def test_compiled_blocks_match_eager(rank_pool, tp: int, checkpointing: str | None) -> None:
    for rank, r in enumerate(rank_pool(2).run(compile_body, tp, checkpointing, timeout=900)):
        print(f"\nTP={tp} ckpt={checkpointing} rank {rank}: loss rel {r['loss']:.2e}, worst grad rel {r['grad']:.2e}; "
              f"fwd+bwd eager {r['eager_s'][1] * 1e3:.1f} ms, compiled {r['compiled_s'][1] * 1e3:.1f} ms "
              f"(first compiled call {r['compiled_s'][0]:.1f} s)")
        assert r["compiled_blocks"] == r["blocks"] == CONFIG["num_hidden_layers"] and r["eager_compiled_blocks"] == 0
        assert r["same_names"]
        assert r["loss"] < TOL and r["grad"] < TOL, r


def test_compile_config_is_validated() -> None:
    import nxd
    from nxd import ConfigError

    assert nxd.neuronx_distributed_config(compile_config=False)["compile_config"] is None
    assert nxd.neuronx_distributed_config(compile_config=True)["compile_config"]["backend"] == "inductor"
    assert nxd.neuronx_distributed_config(compile_config={"mode": "max-autotune"})["compile_config"]["mode"] == "max-autotune"
    with pytest.raises(ConfigError, match="compile_config has unknown key 'fullgraf'.*did you mean 'fullgraph'"):
        nxd.neuronx_distributed_config(compile_config={"fullgraf": True})
