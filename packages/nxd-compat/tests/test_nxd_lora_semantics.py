"""NxD's ``LoraModel`` semantics on nxd-lora (issue 44): ``state_dict`` per ``save_lora_base`` /
``merge_lora`` / ``merge_sharded_lora`` as NxD's ``modules/lora/model.py`` defines them, ``load_state_dict``
with and without an argument, ``get_lora_model``'s class, NxD's wrapper layers, and the small
NxD-isms of the same issue (``trainer.model``, ``verify_casted_dtype``'s message, ``autocast("cuda")``
under ``nxd-compat-run`` on a CPU host). Oracles: the merged weight computed here from A and B, exact
round trips, and the unadapted model."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch
from torch import nn

from neuronx_distributed.modules.lora import LoraConfig, LoraModel, get_lora_model

ADAPTER_KEYS = {"linear.lora_A.weight", "linear.lora_B.weight", "conv2d.lora_A.weight", "conv2d.lora_B.weight",
                "embedding.lora_embedding_A", "embedding.lora_embedding_B"}


class Module(nn.Module):  # NxD's unit tests' model, with a forward
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(32, 32)
        self.conv2d = nn.Conv2d(32, 32, 4)
        self.embedding = nn.Embedding(32, 32)

    def forward(self, ids: torch.Tensor, x: torch.Tensor, img: torch.Tensor) -> torch.Tensor:
        return self.embedding(ids).sum() + self.linear(x).sum() + self.conv2d(img).sum()


def config(**kw) -> LoraConfig:
    return LoraConfig(lora_rank=4, lora_alpha=8, target_modules=["linear", "conv2d", "embedding"], **kw)


def lora_model(seed: int = 0, **kw) -> LoraModel:
    torch.manual_seed(0)
    base = Module()
    torch.manual_seed(seed)
    model = LoraModel(base, config(**kw))
    with torch.no_grad():  # B starts at 0 (A for the embedding): give every adapter a nonzero update
        for adapter in model.lora_layers.values():
            for piece in adapter.pieces.values():
                piece.lora_A.normal_()
                piece.lora_B.normal_()
    return model


def inputs() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 32, (3, 5), generator=g), torch.randn(3, 32, generator=g), torch.randn(2, 32, 6, 6, generator=g)


def test_adapter_only_by_default_under_nxds_names():
    model = lora_model()
    state = model.state_dict()
    assert set(state) == ADAPTER_KEYS
    piece = model.lora_layers["linear"].pieces["linear"]
    assert torch.equal(state["linear.lora_A.weight"], piece.lora_A) and torch.equal(state["linear.lora_B.weight"],
                                                                                   piece.lora_B)
    # bias="all": every (trainable) bias too, an adapted module's under base_layer (NxD's and PEFT's name)
    assert set(lora_model(bias="all").state_dict()) == ADAPTER_KEYS | {"linear.base_layer.bias",
                                                                        "conv2d.base_layer.bias"}


def test_save_lora_base_modes():
    model = lora_model(save_lora_base=True, merge_sharded_lora=False)
    state = model.state_dict()
    base_keys = {"linear.base_layer.weight", "linear.base_layer.bias", "conv2d.base_layer.weight",
                 "conv2d.base_layer.bias", "embedding.base_layer.weight"}
    assert set(state) == ADAPTER_KEYS | base_keys
    assert torch.equal(state["linear.base_layer.weight"], model.module.linear.weight)
    # merge_sharded_lora=True (NxD's default) saves the adapter only, whatever save_lora_base says
    assert set(lora_model(save_lora_base=True, merge_lora=True).state_dict()) == ADAPTER_KEYS


def test_merged_base_under_the_base_models_own_keys_leaves_the_model_unmerged():
    model = lora_model(save_lora_base=True, merge_lora=True, merge_sharded_lora=False)
    before = {k: v.clone() for k, v in model.module.state_dict().items()}
    out_before = model(*inputs())
    state = model.state_dict()
    assert set(state) == set(Module().state_dict())
    piece = model.lora_layers["linear"].pieces["linear"]
    scale = 8 / 4
    expect = before["linear.weight"].double() + scale * piece.lora_B.double() @ piece.lora_A.double()
    assert torch.allclose(state["linear.weight"].double(), expect, rtol=0, atol=1e-5)
    emb = model.lora_layers["embedding"].pieces["embedding"]  # PEFT's embedding update: (B A)^T
    expect = before["embedding.weight"].double() + scale * (emb.lora_B.double() @ emb.lora_A.double()).t()
    assert torch.allclose(state["embedding.weight"].double(), expect, rtol=0, atol=1e-5)
    assert torch.equal(state["linear.bias"], before["linear.bias"])
    # the merged checkpoint loads into the plain base model and gives the adapted model's output
    plain = Module()
    plain.load_state_dict(state)
    assert torch.allclose(plain(*inputs()), out_before, rtol=1e-5)
    # and the LoRA model itself is as it was
    assert not model.is_lora_merged
    assert all(torch.equal(v, before[k]) for k, v in model.module.state_dict().items())
    assert torch.equal(model(*inputs()), out_before)


def test_round_trips_and_load_without_argument():
    saved = lora_model(seed=0)
    want = saved(*inputs())
    adapter = saved.state_dict()

    fresh = lora_model(seed=1)
    assert not torch.equal(fresh(*inputs()), want)
    result = fresh.load_state_dict(adapter)
    assert result.unexpected_keys == [] and set(result.missing_keys) == set(Module().state_dict())
    assert torch.equal(fresh(*inputs()), want)

    # NxD's second step: the adapter held in lora_ckpt, loaded by load_state_dict() with no argument
    other = lora_model(seed=2)
    assert other.load_state_dict() is None  # nothing asked to load
    other.lora_config = config(load_lora_from_ckpt=True, save_lora_base=True, merge_sharded_lora=False)
    other.lora_ckpt = {**Module().state_dict(), **adapter}
    result = other.load_state_dict()
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert torch.equal(other.lora_layers["linear"].pieces["linear"].lora_B,
                       saved.lora_layers["linear"].pieces["linear"].lora_B)

    # a full save (base under base_layer) loads into the base and the adapters
    full = lora_model(seed=3, save_lora_base=True, merge_sharded_lora=False)
    state = full.state_dict()
    again = lora_model(seed=4, save_lora_base=True, merge_sharded_lora=False)
    with torch.no_grad():
        again.module.linear.weight.zero_()
    result = again.load_state_dict(state)
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert torch.equal(again(*inputs()), full(*inputs()))


def test_keys_that_match_nothing():
    model = lora_model()
    result = model.load_state_dict({"nowhere.lora_A.weight": torch.zeros(1), "nowhere.weight": torch.zeros(1)})
    assert set(result.unexpected_keys) == {"nowhere.lora_A.weight", "nowhere.weight"}
    with pytest.raises(RuntimeError, match="nowhere"):
        model.load_state_dict({"nowhere.weight": torch.zeros(1)}, strict=True)


def test_inside_a_parent_module_it_is_torchs_whole_wrapper():
    model = lora_model()
    parent = nn.ModuleDict({"inner": model})
    state = parent.state_dict()
    assert "inner.module.linear.weight" in state and any(k.startswith("inner.lora_layers.") for k in state)
    nn.ModuleDict({"inner": lora_model(seed=5)}).load_state_dict(state)  # the pair stays consistent


def test_get_lora_model_returns_nxds_class():
    from neuronx_distributed.trainer.model import NxDModel

    torch.manual_seed(0)
    assert isinstance(get_lora_model(Module(), config()), LoraModel)
    wrapped = NxDModel(Module())
    assert get_lora_model(wrapped, config()) is wrapped and isinstance(wrapped.module, LoraModel)
    assert get_lora_model(wrapped, None) is wrapped


def test_nxds_wrapper_layers():
    from neuronx_distributed.modules.lora.layer import LoraEmbedding, LoraLinear

    torch.manual_seed(0)
    base = nn.Linear(8, 6)
    layer = LoraLinear(base, config(use_rslora=True))
    assert repr(layer).startswith("lora.LoraLinear(")
    piece = layer.adapter.pieces["base_layer"]
    with torch.no_grad():
        piece.lora_B.normal_()
    x = torch.randn(5, 8)
    expect = base(x) + (8 / math.sqrt(4)) * x @ piece.lora_A.t() @ piece.lora_B.t()
    assert torch.allclose(layer(x), expect, atol=1e-5)
    weight = base.weight.clone()
    layer.merge()
    assert torch.allclose(base(x), expect, atol=1e-5) and torch.allclose(layer(x), expect, atol=1e-5)
    layer.unmerge()
    assert torch.equal(base.weight, weight)
    with pytest.raises(TypeError, match="LoraEmbedding wraps Embedding"):
        LoraEmbedding(base, config())
    with pytest.raises(NotImplementedError, match="Conv1D"):  # NotProvidedError
        LoraLinear(base, config(), is_conv_1d_layer=True)


def test_trainer_modules_and_messages():
    import neuronx_distributed as nxd
    from neuronx_distributed.parallel_layers.utils import verify_casted_dtype
    from nxd_core_parallel.trainer import NxDModel

    assert nxd.trainer.model.NxDModel is NxDModel
    assert nxd.trainer.trainer.initialize_parallel_model is nxd.initialize_parallel_model
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(AssertionError, match="got torch.float32 instead"):
        verify_casted_dtype(torch.zeros(1))


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a CUDA host autocast('cuda') is real")
def test_cuda_autocast_disables_itself_on_a_cpu_host_under_the_runner(xla_stand_in):
    from nxd_compat import xla_emulation

    # xla_stand_in does what nxd-compat-run does: torch now finds a torch_xla
    assert importlib.util.find_spec("torch_xla") is not None
    with pytest.raises(RuntimeError, match="bfloat16"), torch.autocast("cuda", dtype=torch.bfloat16):
        pass  # torch's own check takes the stand-in for torch-xla: the bug
    xla_emulation.count_only_real_torch_xla()  # undone by xla_stand_in
    with pytest.warns(UserWarning, match="Disabling autocast"), torch.autocast("cuda", dtype=torch.bfloat16):
        assert not torch.is_autocast_enabled("cuda")


def test_patches_of_nxds_module_paths_change_what_they_patch():
    """docs/migration.md, NxD's unit tests' patches: the attributes provided for them are looked up
    where NxD's tests patch them, so the patch changes the behaviour it changes in NxD."""
    from unittest import mock

    from neuronx_distributed.optimizer import NeuronZero1Optimizer
    from neuronx_distributed.pipeline import partition

    with mock.patch("neuronx_distributed.pipeline.partition.get_pipeline_model_parallel_size", return_value=4):
        assert partition.stage_to_pipeline_parallel_rank(6) == 2
    with mock.patch("neuronx_distributed.optimizer.zero_redundancy_optimizer.NeuronZero1Optimizer.step") as step:
        assert NeuronZero1Optimizer.step is step  # nxd-zero1's class itself


def checkpoint_round_trip_body(path: str) -> dict:
    import neuronx_distributed as nxd_api

    def get_model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))

    config = nxd_api.neuronx_distributed_config(tensor_parallel_size=2)
    lora = LoraConfig(lora_rank=2, target_modules=["0", "2"])
    model = get_lora_model(nxd_api.initialize_parallel_model(config, get_model), lora)
    with torch.no_grad():
        for adapter in model.module.lora_layers.values():
            for piece in adapter.pieces.values():
                piece.lora_B.normal_(generator=torch.Generator().manual_seed(3))
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(4))
    want = model(x)
    nxd_api.save_checkpoint(path, "step1", model=model)
    nxd_api.finalize_checkpoint()
    fresh = get_lora_model(nxd_api.initialize_parallel_model(config, get_model), lora)
    nxd_api.load_checkpoint(path, "step1", model=fresh)
    return {"class": type(model.module).__name__, "keys": sorted(model.state_dict()), "exact": torch.equal(fresh(x), want)}


def test_nxd_checkpoint_of_an_nxd_lora_model_round_trips_exactly(rank_pool, tmp_path):
    """NxD's flow: nxd.save_checkpoint of NxDModel(LoraModel) saves what LoraModel.state_dict gives
    (the adapter; TP=2 on 2 ranks), nxd.load_checkpoint puts it back: same outputs bit for bit."""
    for out in rank_pool(2).run(checkpoint_round_trip_body, str(tmp_path)):
        assert out["class"] == "LoraModel" and out["exact"]
        assert out["keys"] == ["0.lora_A.weight", "0.lora_B.weight", "2.lora_A.weight", "2.lora_B.weight"]
