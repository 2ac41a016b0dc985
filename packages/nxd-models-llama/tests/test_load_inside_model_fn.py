"""NxD's habit: ``model_fn`` builds the family's plain model and loads Hugging Face weights into it,
then ``initialize_parallel_model`` shards it. The plain model (its plan not applied yet) loads whole
tensors whatever the context's TP size; after the plan, each TP rank holds its slices. Two gloo
ranks at TP=2 against transformers in one process, logits within 1e-5."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from llama_test_utils import CONFIGS, batch, quiet_transformers, save_hf  # noqa: E402

quiet_transformers()


def load_inside_model_fn_body(cases: list[tuple[str, str]], data: dict[str, dict]) -> dict[str, torch.Tensor]:
    """On every rank: ``initialize_parallel_model(TP=2, model_fn)`` whose ``model_fn`` loads the HF
    folder into the plain model; the gathered logits per case."""
    import json

    import nxd
    from nxd_modeling.generation import gather_vocab_logits
    from nxd_models_llama import LlamaConfig, LlamaForCausalLM, load_hf_checkpoint

    config_nxd = nxd.neuronx_distributed_config(tensor_parallel_size=2)
    out = {}
    for name, hf_dir in cases:
        config = LlamaConfig.from_dict(json.loads((Path(hf_dir) / "config.json").read_text()))

        def model_fn(config=config, hf_dir=hf_dir) -> torch.nn.Module:
            model = LlamaForCausalLM(config)
            load_hf_checkpoint(model, hf_dir)  # plain: whole tensors, though the context has TP=2
            return model

        model = nxd.initialize_parallel_model(config_nxd, model_fn)
        with torch.no_grad():
            logits = model(data[name]["input_ids"]).logits
        out[name] = gather_vocab_logits(logits, config.vocab_size)
    return out


def test_hf_weights_loaded_inside_model_fn_match_transformers(rank_pool, tmp_path: Path) -> None:
    from transformers import LlamaForCausalLM

    names = ("gqa", "odd")  # odd: vocabulary 101 (padded over TP), 6 heads, biases
    dirs = {name: save_hf(name, tmp_path / name) for name in names}
    data = {name: batch(CONFIGS[name]["vocab_size"]) for name in names}
    results = rank_pool(2).run(load_inside_model_fn_body, [(n, str(d)) for n, d in dirs.items()], data)
    for name in names:
        expected = LlamaForCausalLM.from_pretrained(str(dirs[name]), dtype=torch.float32)(data[name]["input_ids"]).logits
        for rank_logits in results:
            got = rank_logits[name]
            error = ((got - expected).abs().max() / expected.abs().max()).item()
            assert error < 1e-5, f"{name}: relative error {error:.2e}"
