"""NxD's MoE API (``neuronx_distributed.modules.moe``) built exactly as NxD's Mixtral training
example builds it (``initialize_mixtral_moe_layer``: RouterTopK / ExpertMLPs / MoE with NxD's
arguments), at TP=2 on 2 gloo ranks, against transformers' ``MixtralSparseMoeBlock`` with the same
weights: output, router logits and the gradients of the router and of this rank's expert slices."""

from __future__ import annotations

from functools import partial

import pytest
import torch

pytest.importorskip("nxd_moe")
pytest.importorskip("transformers")

H, INTER, E, K, S, B = 16, 32, 4, 2, 6, 2


def _hf_block():
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    torch.manual_seed(0)
    config = MixtralConfig(hidden_size=H, intermediate_size=INTER, num_local_experts=E, num_experts_per_tok=K)
    block = MixtralSparseMoeBlock(config).float()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.2)
    return block


def _nxd_moe_as_mixtral_example(config_capacity_factor=None, **moe_options):
    """Verbatim arguments of NxD's examples/training/mixtral/modeling_mixtral_moe_nxd.py."""
    from neuronx_distributed.modules.moe.expert_mlps import ExpertMLPs
    from neuronx_distributed.modules.moe.model import MoE
    from neuronx_distributed.modules.moe.routing import RouterTopK

    router = RouterTopK(num_experts=E, top_k=K, hidden_size=H, sequence_parallel_enabled=True, sequence_dimension=0)
    init_method = partial(torch.nn.init.normal_, std=0.02)
    expert_mlps = ExpertMLPs(num_experts=E, top_k=K, hidden_size=H, intermediate_size=INTER, hidden_act="silu",
                             glu_mlp=True, capacity_factor=config_capacity_factor, normalize_top_k_affinities=True,
                             init_method=init_method, output_layer_init_method=init_method)
    options = {"return_expert_index": False, "sequence_parallel_enabled": False, **moe_options}
    return MoE(router=router, expert_mlps=expert_mlps, return_router_logits=True, sequence_dimension=0, **options)


def moe_body(state: dict, x: torch.Tensor) -> dict:
    from nxd_core_parallel import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    rank, i = parallel_state.get_tensor_model_parallel_rank(), INTER // 2
    moe = _nxd_moe_as_mixtral_example()
    with torch.no_grad():  # NxD's names and layouts: gate_up [E, H, 2I/tp] (gate | up columns), down [E, I/tp, H]
        moe.router.linear_router.weight.copy_(state["gate.weight"])
        gu, down = state["experts.gate_up_proj"], state["experts.down_proj"]
        local_gu = torch.cat([gu[:, rank * i:(rank + 1) * i], gu[:, INTER + rank * i:INTER + (rank + 1) * i]], dim=1)
        moe.expert_mlps.mlp_op.gate_up_proj.weight.copy_(local_gu.transpose(1, 2))
        moe.expert_mlps.mlp_op.down_proj.weight.copy_(down[:, :, rank * i:(rank + 1) * i].transpose(1, 2))
    x = x.clone().requires_grad_(True)
    out, logits = moe(x)  # NxD's layout [s, b, h]
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return {"out": out.detach(), "logits": logits.detach(), "router_grad": moe.router.weight.grad,
            "down_grad": moe.expert_mlps.mlp_op.down_proj.weight.grad.transpose(1, 2), "x_grad": x.grad}


def test_nxd_moe_signature_matches_hf_mixtral_block(rank_pool):
    hf = _hf_block()
    x = torch.randn(S, B, H, generator=torch.Generator().manual_seed(1))
    got = rank_pool(2).run(moe_body, {k: v.detach() for k, v in hf.state_dict().items()}, x)
    xb = x.transpose(0, 1).contiguous().requires_grad_(True)
    want = hf(xb)
    (want.transpose(0, 1) * torch.linspace(-1, 1, want.numel()).view(S, B, H)).sum().backward()
    want_logits = (xb.reshape(-1, H) @ hf.gate.weight.T).detach()
    i = INTER // 2
    for rank, g in enumerate(got):
        # fp32 vs fp32, sums over 2 ranks in another order: errors ~1e-7
        torch.testing.assert_close(g["out"], want.detach().transpose(0, 1), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(g["logits"], want_logits, rtol=1e-5, atol=1e-6)  # rows batch-major
        torch.testing.assert_close(g["router_grad"], hf.gate.weight.grad, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(g["down_grad"], hf.experts.down_proj.grad[:, :, rank * i:(rank + 1) * i],
                                   rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(g["x_grad"], xb.grad.transpose(0, 1), rtol=1e-5, atol=1e-6)


def shuffle_body(x: torch.Tensor) -> dict:
    from nxd_core_parallel import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)  # DP=2
    x = x[torch.distributed.get_rank()]  # each DP rank its own tokens
    out = {}
    for size in (1, 2):
        torch.manual_seed(0)  # the same weights
        moe = _nxd_moe_as_mixtral_example(token_shuffle_group_size=size, token_shuffle_seed=7 if size > 1 else None)
        xs = x.clone().requires_grad_(True)
        y = moe(xs)[0]
        loss = (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum()
        loss.backward()
        grads = [p.grad.clone() for p in moe.parameters()]
        for g in grads:  # what data parallelism's reduction sums
            torch.distributed.all_reduce(g)
        out[size] = {"loss": loss.detach(), "out": y.detach(), "x_grad": xs.grad, "grads": grads,
                     "permutation": moe.shuffle_permutation}
    return out


def test_token_shuffling_is_a_permutation(rank_pool):
    """NxD's token shuffling (``MoE(token_shuffle_group_size=2)`` over DP=2): each rank's tokens are
    routed on the ranks of its group and come back in place, so output, loss and gradients (after
    the data-parallel sum) are the unshuffled layer's: the same per-token products, grouped
    differently into expert batches (fp32, ~1e-7)."""
    x = torch.randn(2, S, B, H, generator=torch.Generator().manual_seed(2))
    for rank, got in enumerate(rank_pool(2).run(shuffle_body, x)):
        plain, shuffled = got[1], got[2]
        assert not torch.equal(shuffled["permutation"], torch.arange(S * B)), rank
        for key in ("loss", "out", "x_grad"):
            torch.testing.assert_close(shuffled[key], plain[key], rtol=1e-5, atol=1e-6, msg=f"{key} rank {rank}")
        for a, b in zip(shuffled["grads"], plain["grads"], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"grads rank {rank}")


def shared_body(state: dict, x: torch.Tensor) -> dict:
    """NxD's MoE with ``SharedExperts`` (fused and unfused gate/up), an ``rmsnorm`` and
    ``return_expert_index``, at TP=2, loaded with the reference's weights (NxD's names/layouts)."""
    from neuronx_distributed.modules.moe.shared_experts import SharedExperts
    from nxd_core_parallel import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    rank, i, n = parallel_state.get_tensor_model_parallel_rank(), INTER // 2, SHARED_N
    out = {}
    for fused, sp in ((False, False), (True, False), (False, True)):
        shared = SharedExperts(hidden_size=H, intermediate_size=INTER, num_shared_experts=n, hidden_act="silu",
                               fused_gate_up_projection=fused)
        norm = torch.nn.RMSNorm(H, eps=1e-6)
        moe = _nxd_moe_as_mixtral_example(shared_experts=shared, rmsnorm=norm, return_expert_index=True,
                                          sequence_parallel_enabled=sp)
        dim = n * i  # this rank's rows of the shared experts' [n*I, H] gate / up
        gate, up = (state[f"shared.{k}_proj.weight"][rank * dim:(rank + 1) * dim] for k in ("gate", "up"))
        with torch.no_grad():
            moe.router.linear_router.weight.copy_(state["gate.weight"])
            gu, down = state["experts.gate_up_proj"], state["experts.down_proj"]
            local_gu = torch.cat([gu[:, rank * i:(rank + 1) * i], gu[:, INTER + rank * i:INTER + (rank + 1) * i]], 1)
            moe.expert_mlps.mlp_op.gate_up_proj.weight.copy_(local_gu.transpose(1, 2))
            moe.expert_mlps.mlp_op.down_proj.weight.copy_(down[:, :, rank * i:(rank + 1) * i].transpose(1, 2))
            norm.weight.copy_(state["norm.weight"])
            if fused:  # stride 2: this rank's gate rows, then its up rows
                shared.gate_up_proj.weight.copy_(torch.cat([gate, up]))
            else:
                shared.gate_proj.weight.copy_(gate)
                shared.up_proj.weight.copy_(up)
            shared.down_proj.weight.copy_(state["shared.down_proj.weight"][:, rank * dim:(rank + 1) * dim])
        # under sequence parallelism each rank holds its half of the sequence ([s/2, b, h])
        xs = (x.chunk(2)[rank] if sp else x).clone().requires_grad_(True)
        y, logits, index = moe(xs)
        weights = torch.linspace(-1, 1, x.numel()).view_as(x)
        (y * (weights.chunk(2)[rank] if sp else weights)).sum().backward()
        norm_grad = norm.weight.grad.clone()
        if sp:  # each rank normalised its own tokens: the optimizer sums the norm's gradient over TP
            torch.distributed.all_reduce(norm_grad)
        out[(fused, sp)] = {"out": y.detach(), "logits": logits.detach(), "index": index, "x_grad": xs.grad,
                            "down_grad": shared.down_proj.weight.grad, "norm_grad": norm_grad,
                            "names": sorted(k for k in moe.state_dict() if k.startswith("shared_experts"))}
    return out


SHARED_N = 2


def test_nxd_shared_experts_rmsnorm_and_expert_index_match_a_dense_reference(rank_pool):
    """``MoE(shared_experts=SharedExperts(...), rmsnorm=..., return_expert_index=True)`` at TP=2
    (fused and separate gate/up; and with sequence parallelism) against one process: transformers' ``MixtralSparseMoeBlock`` plus a dense SwiGLU of
    ``num_shared_experts * intermediate_size`` (``LlamaMLP``), both after the same RMSNorm. Output,
    router logits, expert index, input / norm / shared-down gradients; fp32, sums over 2 ranks in
    another order (~1e-7)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    hf = _hf_block()
    torch.manual_seed(3)
    dense = LlamaMLP(LlamaConfig(hidden_size=H, intermediate_size=SHARED_N * INTER, hidden_act="silu",
                                 num_attention_heads=2, num_key_value_heads=2)).float()
    norm = torch.nn.RMSNorm(H, eps=1e-6)
    with torch.no_grad():
        for p in [*dense.parameters(), norm.weight]:
            p.normal_(0.5 if p is norm.weight else 0.0, 0.2)
    state = {k: v.detach() for k, v in hf.state_dict().items()}
    state |= {f"shared.{k}": v.detach() for k, v in dense.state_dict().items()} | {"norm.weight": norm.weight.detach()}
    x = torch.randn(S, B, H, generator=torch.Generator().manual_seed(1))
    got = rank_pool(2).run(shared_body, state, x)
    xb = x.transpose(0, 1).contiguous().requires_grad_(True)
    normed = norm(xb)
    want = hf(normed) + dense(normed)
    (want.transpose(0, 1) * torch.linspace(-1, 1, want.numel()).view(S, B, H)).sum().backward()
    logits = (normed.reshape(-1, H) @ hf.gate.weight.T).detach()
    want_index = logits.softmax(-1).topk(K, dim=-1).indices
    d = SHARED_N * INTER // 2
    for rank, per_rank in enumerate(got):
        for (fused, sp), g in per_rank.items():
            msg = f"rank {rank} fused={fused} sequence_parallel={sp}"
            mine = (lambda t, r=rank: t.chunk(2)[r]) if sp else (lambda t: t)  # noqa: E731  this rank's half
            torch.testing.assert_close(g["out"], mine(want.detach().transpose(0, 1)), rtol=1e-5, atol=1e-6, msg=msg)
            if not sp:  # under SP the logits / index rows are the layer's (every token, batch-major)
                torch.testing.assert_close(g["logits"], logits, rtol=1e-5, atol=1e-6, msg=msg)
                assert torch.equal(g["index"].sort(-1).values, want_index.sort(-1).values), msg
            torch.testing.assert_close(g["x_grad"], mine(xb.grad.transpose(0, 1)), rtol=1e-5, atol=1e-6, msg=msg)
            torch.testing.assert_close(g["norm_grad"], norm.weight.grad, rtol=1e-5, atol=1e-6, msg=msg)
            torch.testing.assert_close(g["down_grad"], dense.down_proj.weight.grad[:, rank * d:(rank + 1) * d],
                                       rtol=1e-5, atol=1e-6, msg=msg)
            proj = ["gate_up_proj"] if fused else ["gate_proj", "up_proj"]
            assert g["names"] == sorted(f"shared_experts.{p}.weight" for p in [*proj, "down_proj"]), msg


def nxd_token_shuffle_test_body() -> dict:
    """What NxD's ``test/unit_test/modules/moe/test_token_shuffle.py`` (Release 2.29) does, through
    the same calls (its module setup: ``initialize_model_parallel``, ``parallel_state.
    initialize_token_shuffle_group``, ``random.model_parallel_xla_manual_seed``; its test:
    ``token_shuffle`` of ``arange(2048)`` then ``token_unshuffle``, exactly equal), at its group
    size 1 and, over the 2 data-parallel ranks here, 2."""
    from neuronx_distributed import parallel_layers
    from neuronx_distributed.modules.moe import token_shuffling

    parallel_layers.parallel_state.initialize_model_parallel(tensor_model_parallel_size=1,
                                                             pipeline_model_parallel_size=1)
    out = {}
    for size in (1, 2):
        parallel_layers.parallel_state.initialize_token_shuffle_group(token_shuffle_group_size=size)
        parallel_layers.random.model_parallel_xla_manual_seed(0)
        hidden_states = torch.arange(2048).reshape(1, -1, 1) + 10_000 * torch.distributed.get_rank()
        permuted_states, permutation = token_shuffling.token_shuffle(hidden_states)
        unpermuted_states = token_shuffling.token_unshuffle(permuted_states, permutation)
        out[size] = {"equal": torch.equal(hidden_states, unpermuted_states),
                     "moved": not torch.equal(permuted_states, hidden_states),
                     "foreign": bool((permuted_states // 10_000 != torch.distributed.get_rank()).any()),
                     "groups": parallel_layers.parallel_state.get_token_shuffle_replica_groups(),
                     "size": parallel_layers.parallel_state.get_token_shuffle_group_size()}
    return out


def test_nxds_token_shuffle_unit_test_on_two_ranks(rank_pool):
    for rank, got in enumerate(rank_pool(2).run(nxd_token_shuffle_test_body)):
        assert got[1] == {"equal": True, "moved": True, "foreign": False, "groups": [[0], [1]], "size": 1}, rank
        assert got[2] == {"equal": True, "moved": True, "foreign": True, "groups": [[0, 1]], "size": 2}, rank


def test_unsupported_nxd_options_are_refused():
    from neuronx_distributed.modules.moe.expert_mlps import ExpertMLPs
    from nxd_compat.surface import NotProvidedError

    with pytest.raises(NotProvidedError, match="glu_mlp"):
        ExpertMLPs(num_experts=E, top_k=K, hidden_size=H, intermediate_size=INTER, hidden_act="silu",
                   glu_mlp=False, capacity_factor=None)

    from neuronx_distributed.modules.moe.model_utils import GLUType
    from neuronx_distributed.modules.moe.shared_experts import SharedExperts

    with pytest.raises(NotProvidedError, match="glu_type"):  # NxD's SWIGLU is gate * act(gate) * up
        ExpertMLPs(num_experts=E, top_k=K, hidden_size=H, intermediate_size=INTER, hidden_act="silu",
                   glu_mlp=True, capacity_factor=None, glu_type=GLUType.SWIGLU)
    for option in ("sequence_parallel_enabled", "transpose_weights"):
        with pytest.raises(NotProvidedError, match=option):
            SharedExperts(hidden_size=H, intermediate_size=INTER, num_shared_experts=1, hidden_act="silu",
                          **{option: True})
