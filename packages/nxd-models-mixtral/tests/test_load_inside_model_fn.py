"""NxD's habit with Mixtral: ``model_fn`` builds the plain ``MixtralForCausalLM`` (every expert whole)
and loads the Hugging Face folder into it; ``initialize_parallel_model`` then shards it over TP and
EP. Two gloo ranks (TP=2, then EP=2) against transformers in one process, logits within 1e-5."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from mixtral_test_utils import batch, quiet_transformers, save_hf  # noqa: E402

quiet_transformers()


def load_inside_model_fn_body(hf_dir: str, data: dict[str, torch.Tensor], sizes: dict[str, int]) -> torch.Tensor:
    """On every rank: ``initialize_parallel_model(sizes, model_fn)`` whose ``model_fn`` loads the HF
    folder into the plain model; the logits gathered over TP."""
    import json

    import nxd
    from nxd_models_llama import gather_vocab_logits
    from nxd_models_mixtral import MixtralConfig, MixtralForCausalLM, load_hf_checkpoint

    config = MixtralConfig.from_dict(json.loads((Path(hf_dir) / "config.json").read_text()))

    def model_fn() -> torch.nn.Module:
        model = MixtralForCausalLM(config)
        load_hf_checkpoint(model, hf_dir)  # plain: whole tensors and every expert, whatever TP/EP
        return model

    model = nxd.initialize_parallel_model(nxd.neuronx_distributed_config(**sizes), model_fn)
    with torch.no_grad():
        return gather_vocab_logits(model(data["input_ids"]).logits)


def test_hf_weights_loaded_inside_model_fn_match_transformers(rank_pool, tmp_path: Path) -> None:
    from transformers import MixtralForCausalLM

    hf_dir = save_hf(tmp_path / "hf")
    data = batch()
    expected = MixtralForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)(data["input_ids"]).logits
    for sizes in ({"tensor_parallel_size": 2}, {"expert_parallel_size": 2}):
        for got in rank_pool(2).run(load_inside_model_fn_body, str(hf_dir), data, sizes):
            error = ((got - expected).abs().max() / expected.abs().max()).item()
            assert error < 1e-5, f"{sizes}: relative error {error:.2e}"
