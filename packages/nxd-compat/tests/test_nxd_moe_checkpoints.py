"""NxD's MoE checkpoints (state-dict names, shapes, TP and EP sharding as NxD writes them) load in
nxd, and nxd's load back into NxD's.

NxD's ``scripts/checkpoint_converter.py`` (vendored) with the expert partition dims NxD's own
``examples/training/{mixtral,dbrx}/convert_checkpoints.py`` declare shards a full MoE state in
NxD's full layout (what DBRX's converter makes of a Hugging Face checkpoint:
``router.linear_router.weight`` ``[E, H]``, ``expert_mlps.mlp_op.gate_proj/up_proj.weight``
``[E, H, I]``, ``down_proj.weight`` ``[E, I, H]``) into NxD's per-rank files: TP=2
(``gate_up_proj`` ``[E, H, 2I/tp]`` = this rank's gate columns then its up columns) and EP=2
(``dp_rank_00_ep_rank_EE_tp_rank_00_pp_rank_00.pt``). Each loads into ``neuronx_distributed.
modules.moe.MoE`` (built as NxD's Mixtral example builds it) through ``load_checkpoint``, and the
layer's output equals transformers' ``MixtralSparseMoeBlock`` with the same weights (the oracle).
Reverse: what nxd saves at TP=2 and at EP=2 is merged by NxD's ``--convert_to_full_state`` into
the full state it came from, tensor for tensor.
"""

from __future__ import annotations

import json
from functools import partial

import pytest
import torch

pytest.importorskip("nxd_moe")
pytest.importorskip("transformers")

H, INTER, E, K, S, B = 16, 32, 4, 2, 6, 2
PREFIX = "model.layers.0.mlp."
#: what NxD's converter reads from the model's config.json
CONFIG = {"num_attention_heads": 4, "num_key_value_heads": 4, "hidden_size": H, "num_hidden_layers": 1,
          "num_local_experts": E}
#: tag -> (tensor_parallel_size, expert_parallel_size) NxD's converter writes it for
LAYOUTS = {"nxd_tp2": (2, 1), "nxd_ep2": (1, 2), "nxd_ep2_saved": (1, 2)}


def _hf_block():
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    torch.manual_seed(0)
    block = MixtralSparseMoeBlock(MixtralConfig(hidden_size=H, intermediate_size=INTER, num_local_experts=E,
                                                num_experts_per_tok=K)).float()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.2)
    return block


def _nxd_full_state(block) -> dict[str, torch.Tensor]:
    """The full state in NxD's layout (DBRX's converter: gate/up ``[E, H, I]``, down ``[E, I, H]``)."""
    gate_up, down = block.experts.gate_up_proj.detach(), block.experts.down_proj.detach()
    return {f"{PREFIX}router.linear_router.weight": block.gate.weight.detach().clone(),
            f"{PREFIX}expert_mlps.mlp_op.gate_proj.weight": gate_up[:, :INTER].transpose(1, 2).contiguous(),
            f"{PREFIX}expert_mlps.mlp_op.up_proj.weight": gate_up[:, INTER:].transpose(1, 2).contiguous(),
            f"{PREFIX}expert_mlps.mlp_op.down_proj.weight": down.transpose(1, 2).contiguous()}


def _nxd_converter(*argv: str) -> None:
    from neuronx_distributed.scripts.checkpoint_converter import CheckpointConverterBase

    class MoEConverter(CheckpointConverterBase):
        # as NxD's examples/training/{mixtral,dbrx}/convert_checkpoints.py declare them
        gate_up_proj_partition_dim = 2  # ExpertFusedColumnParallelLinear
        down_proj_partition_dim = 1  # ExpertFusedRowParallelLinear

    converter = MoEConverter()
    args, _ = converter.get_arg_parser().parse_known_args(["--hw_backend", "trn2", *argv])
    converter.run(args)


def _model(tp: int, ep: int) -> torch.nn.Module:
    """NxD's MoE layer, built with the Mixtral example's arguments, at ``model.layers.0.mlp``."""
    from neuronx_distributed.modules.moe.expert_mlps import ExpertMLPs
    from neuronx_distributed.modules.moe.model import MoE
    from neuronx_distributed.modules.moe.routing import RouterTopK
    from nxd_core_parallel import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, expert_model_parallel_size=ep)
    torch.manual_seed(123)  # not the HF seed: every weight must come from the checkpoint
    init = partial(torch.nn.init.normal_, std=0.02)
    experts = ExpertMLPs(num_experts=E, top_k=K, hidden_size=H, intermediate_size=INTER, hidden_act="silu",
                         glu_mlp=True, capacity_factor=None, normalize_top_k_affinities=True, init_method=init,
                         output_layer_init_method=init)
    router = RouterTopK(num_experts=E, top_k=K, hidden_size=H, sequence_parallel_enabled=True, sequence_dimension=0)
    layer = torch.nn.Module()
    layer.mlp = MoE(router=router, expert_mlps=experts, return_router_logits=True, sequence_parallel_enabled=False,
                    sequence_dimension=0)
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.layers = torch.nn.ModuleList([layer])
    return model


def load_body(root: str, x: torch.Tensor) -> dict:
    import nxd

    out = {}
    for tag, (tp, ep) in LAYOUTS.items():
        model = _model(tp, ep)
        shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        nxd.load_checkpoint(root, tag=tag, model=model)
        model.eval()  # no jitter; the routing of the same weights is the oracle's
        with torch.no_grad():
            out[tag] = (model.model.layers[0].mlp(x)[0], shapes)
    return out


def save_body(root: str) -> None:
    import nxd

    for tag, (tp, ep) in LAYOUTS.items():
        model = _model(tp, ep)
        nxd.load_checkpoint(root, tag=tag, model=model)
        nxd.save_checkpoint(root, f"saved_{tag}", model=model)


def test_nxd_moe_checkpoints_load_and_convert_back(rank_pool, tmp_path):
    hf = _hf_block()
    full = _nxd_full_state(hf)
    torch.save(full, tmp_path / "full.pt")
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    root = tmp_path / "ckpts"
    for tag in ("nxd_tp2", "nxd_ep2"):
        tp, ep = LAYOUTS[tag]
        _nxd_converter("--convert_from_full_state", "--input_dir", str(tmp_path / "full.pt"), "--config",
                       str(tmp_path / "config.json"), "--output_dir", str(root / tag), "--tp_size", str(tp),
                       "--ep_size", str(ep))
    files = sorted(p.name for p in (root / "nxd_ep2" / "model").iterdir())
    assert files == ["dp_rank_00_ep_rank_00_tp_rank_00_pp_rank_00.pt", "dp_rank_00_ep_rank_01_tp_rank_00_pp_rank_00.pt"]
    # NxD's save_checkpoint at EP=2 writes the same files, each holding its EP rank's experts only
    # (NxD's converter puts every expert in each): that layout is built from the converter's here
    (root / "nxd_ep2_saved" / "model").mkdir(parents=True)
    for ep_rank, name in enumerate(files):
        state = torch.load(root / "nxd_ep2" / "model" / name, weights_only=True)
        local = {k: v[ep_rank * E // 2:(ep_rank + 1) * E // 2] if "expert_mlps" in k else v for k, v in state.items()}
        torch.save(local, root / "nxd_ep2_saved" / "model" / name)

    x = torch.randn(S, B, H, generator=torch.Generator().manual_seed(1))
    got = rank_pool(2).run(load_body, str(root), x)
    with torch.no_grad():
        want = hf(x.transpose(0, 1).contiguous()).transpose(0, 1)
    i = INTER // 2
    for rank, per_tag in enumerate(got):
        # NxD's names and shapes (TP=2: gate and up columns of this rank; EP=2: all experts)
        assert per_tag["nxd_tp2"][1] == {f"{PREFIX}router.linear_router.weight": (E, H),
                                         f"{PREFIX}expert_mlps.mlp_op.gate_up_proj.weight": (E, H, 2 * i),
                                         f"{PREFIX}expert_mlps.mlp_op.down_proj.weight": (E, i, H)}, rank
        for tag in LAYOUTS:
            # fp32 vs fp32: the same products summed in another order (TP / EP partial sums), ~1e-7
            torch.testing.assert_close(per_tag[tag][0], want, rtol=1e-5, atol=1e-6, msg=f"{tag} rank {rank}")

    rank_pool(2).run(save_body, str(root))
    for tag, (tp, _) in LAYOUTS.items():
        # nxd's files hold every expert (gathered over EP): NxD's EP=1 layout, merged with --ep_size 1
        _nxd_converter("--convert_to_full_state", "--input_dir", str(root / f"saved_{tag}" / "model"), "--config",
                       str(tmp_path / "config.json"), "--output_dir", str(tmp_path / f"merged_{tag}"),
                       "--tp_size", str(tp))
        merged = torch.load(tmp_path / f"merged_{tag}" / "checkpoint.pt", weights_only=True)
        assert sorted(merged) == sorted(full), tag
        assert [k for k in full if not torch.equal(merged[k], full[k])] == [], tag

