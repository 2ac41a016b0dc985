"""DeepSeek-V3 multi-token prediction (``mtp_depth``) against a straightforward single-process
reference built from transformers' own MTP layers (``transformers.modeling_layers.MtpModel``, the
class its ``generate(use_mtp=True)`` drafts with), loaded by transformers from the same checkpoint:
DeepSeek's layout, the MTP modules as ``model.layers.{num_hidden_layers + k}.*``. The reference loss
is the paper's (section 2.2), written out here: main cross-entropy + lambda x the mean over the D
depths of each depth's cross-entropy, depth k reading the main model's final hidden state (depth 1)
or the previous depth's, and the embeddings of the tokens k places ahead (teacher forcing). Loss and
every gradient (the MTP modules' and the shared embedding/head's) within 1e-5 relative (fp32), in
one process and on 2 gloo ranks at TP=2 with sequence parallelism (heads split, ``eh_proj`` and the
MTP norms see a sequence slice: their gradients are summed over TP); export writes the checkpoint back tensor for tensor; a checkpoint without MTP weights is refused by
name (MTP under CP: test_context_parallel.py)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from deepseek_test_utils import BUFFERS, CONFIG, batch  # noqa: E402

from nxd.errors import ConfigError
from nxd_testing import reference as oracle
from nxd_testing.reference import quiet_transformers

quiet_transformers()

DEPTH, WEIGHT = 2, 0.3
LAYERS = CONFIG["num_hidden_layers"]


def save_mtp_checkpoint(out: Path, seed: int = 0) -> Path:
    """A transformers DeepSeek-V3 with ``LAYERS + DEPTH`` layers saved in checkpoint layout, then the
    last ``DEPTH`` layers turned into MTP modules (their ``enorm``/``hnorm``/``eh_proj``/
    ``shared_head.norm`` added) and ``num_hidden_layers`` set back to ``LAYERS``."""
    from safetensors.torch import load_file, save_file
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**{**CONFIG, "num_hidden_layers": LAYERS + DEPTH})).float()
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith(BUFFERS):
                buf.normal_(0.0, 0.3)
    oracle.save_hf_oracle(model, out, spread_norms=True)
    tensors = load_file(str(out / "model.safetensors"))
    h = CONFIG["hidden_size"]
    for k in range(DEPTH):
        p = f"model.layers.{LAYERS + k}."
        for norm in ("enorm", "hnorm", "shared_head.norm"):
            tensors[f"{p}{norm}.weight"] = torch.empty(h).uniform_(0.5, 1.5)
        tensors[f"{p}eh_proj.weight"] = torch.randn(h, 2 * h) * 0.1
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config.update(num_hidden_layers=LAYERS, num_nextn_predict_layers=DEPTH)
    (out / "config.json").write_text(json.dumps(config))
    return out


def shift(t: torch.Tensor, k: int, fill: int) -> torch.Tensor:
    return torch.cat([t[:, k:], t.new_full((t.shape[0], k), fill)], dim=1)


def reference(hf_dir: Path, data: dict[str, torch.Tensor]) -> dict:
    """transformers' main model + its MtpModel loaded from ``hf_dir``; the paper's loss; HF-named grads."""
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM
    from transformers.modeling_layers import MtpModel

    main = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    # transformers finds MTP weights by the released checkpoint's layer number (61); this one has LAYERS
    main._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{LAYERS + k}\..*" for k in range(DEPTH)]
    mtp = MtpModel.from_pretrained(main)  # raises when a weight of the layout is missing
    ids, labels = data["input_ids"], data["labels"]
    positions = torch.arange(ids.shape[1]).unsqueeze(0).expand_as(ids)

    def ce(hidden: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = main.lm_head(hidden)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100)

    hidden = main.model(ids).last_hidden_state  # after the final norm: what transformers' drafting passes
    loss, depths = ce(hidden, labels), []
    for k in range(DEPTH):
        hidden = mtp.forward_layer(k, hidden, positions, None, input_ids=shift(ids, k + 1, 0))
        depths.append(ce(hidden, shift(labels, k + 1, -100)))
    loss = loss + WEIGHT * torch.stack(depths).mean()
    loss.backward()
    grads = oracle.checkpoint_named_grads(main)
    names = {"post_norm.": "shared_head.norm.", "mtp_block.": ""}
    for name, g in oracle.checkpoint_named_grads(mtp).items():
        match = re.match(r"^layers\.(\d+)\.(.+)$", name)
        if match:  # the shared embedding/head are main's parameters (their grads above hold both parts)
            rest = match.group(2)
            for old, new in names.items():
                rest = rest.replace(old, new, 1) if rest.startswith(old) else rest
            grads[f"model.layers.{LAYERS + int(match.group(1))}.{rest}"] = g
    return {"loss": loss.detach(), "grads": grads}


def test_mtp_matches_transformers_mtp_layers_and_round_trips(tmp_path):
    from nxd_models_deepseek.hf_io import collect_hf_state_dict

    src = save_mtp_checkpoint(tmp_path / "hf")
    data = batch(seed=7)
    ref = reference(src, data)
    spec, model = _build(src, mtp_depth=DEPTH, mtp_loss_scaling_factor=WEIGHT)
    out = model(data["input_ids"], labels=data["labels"])
    assert set(out.loss_terms) == {"lm_loss", "mtp_loss"}
    out.loss.backward()
    errors = {"loss": oracle.rel_err(out.loss.detach(), ref["loss"])}
    oracle.grads_into_parameters(model)
    grads = {k: v for k, v in collect_hf_state_dict(model).items() if not k.endswith(BUFFERS)}
    assert set(grads) == set(ref["grads"]), set(grads) ^ set(ref["grads"])
    errors.update({k: oracle.rel_err(grads[k], g) for k, g in ref["grads"].items()})
    worst = max(errors, key=errors.get)
    print(f"\ndeepseek_v3 MTP D={DEPTH}: worst relative error {errors[worst]:.3g} ({worst})")
    assert errors[worst] <= 1e-5, (worst, errors[worst])
    # export: the checkpoint back, MTP modules included, tensor for tensor
    from safetensors.torch import load_file

    _, fresh = _build(src, mtp_depth=DEPTH)
    spec.save_hf(fresh, str(tmp_path / "out"))
    a, b = load_file(str(src / "model.safetensors")), load_file(str(tmp_path / "out" / "model.safetensors"))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["num_nextn_predict_layers"] == DEPTH
    _build(src)  # mtp_depth 0 reads the main model and leaves the MTP tensors, as transformers does


def mtp_rank_body(hf_dir: str, data: dict[str, torch.Tensor]) -> dict | None:
    """TP=2 + SP on every rank: forward/backward with MTP, NxDOptimizer's gradient sync, HF-named grads."""
    import torch.distributed as dist

    from nxd_core_parallel import parallel_state
    from nxd_core_parallel.trainer import NxDOptimizer
    from nxd_models_deepseek.hf_io import collect_hf_state_dict

    context = parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    _, model = _build(Path(hf_dir), {"sequence_parallel": True}, mtp_depth=DEPTH, mtp_loss_scaling_factor=WEIGHT)
    out = model(data["input_ids"], labels=data["labels"])
    out.loss.backward()
    NxDOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), {"optimizer_config": {"grad_clipping": False},
                 "sequence_parallel": True}, overlap_grad_sync=False, context=context).sync_gradients()
    loss = out.loss.detach().clone()
    oracle.grads_into_parameters(model)
    grads = {k: v for k, v in collect_hf_state_dict(model).items() if not k.endswith(BUFFERS)}
    return {"loss": loss, "grads": grads} if dist.get_rank() == 0 else None


def test_mtp_tp2_sp_matches_the_reference(rank_pool, tmp_path):
    src = save_mtp_checkpoint(tmp_path / "hf", seed=1)
    data = batch(seed=8)
    ref = reference(src, data)
    got = rank_pool(2).run(mtp_rank_body, str(src), data, timeout=600)[0]
    errors = {"loss": oracle.rel_err(got["loss"], ref["loss"])}
    assert set(got["grads"]) == set(ref["grads"]), set(got["grads"]) ^ set(ref["grads"])
    errors.update({k: oracle.rel_err(got["grads"][k], g) for k, g in ref["grads"].items()})
    worst = max(errors, key=errors.get)
    print(f"\ndeepseek_v3 MTP D={DEPTH} TP=2 + SP: worst relative error {errors[worst]:.3g} ({worst})")
    assert errors[worst] <= 1e-5, (worst, errors[worst])


def _build(src: Path, nxd_config: dict | None = None, **overrides):
    import nxd

    spec = nxd.get_model("deepseek_v3")
    model = nxd.build_parallel_model(spec, {**json.loads((src / "config.json").read_text()), **overrides}, nxd_config)
    spec.load_hf(model, str(src))
    return spec, model


def test_mtp_without_weights_in_the_checkpoint_is_refused(tmp_path):
    from deepseek_test_utils import save_hf

    src = save_hf(tmp_path / "hf")  # transformers writes num_nextn_predict_layers=1 but no MTP weights
    with pytest.raises(ConfigError, match=r"mtp_depth=1: .* holds no multi-token prediction module"):
        _build(src, mtp_depth=1)
