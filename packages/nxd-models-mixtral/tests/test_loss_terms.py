"""One process: the step contract's named loss terms of a Mixtral step (``lm_loss``, ``aux_loss``,
``z_loss``), as ``nxd train`` logs them, against transformers' MixtralForCausalLM on the same weights:
the cross-entropy of HF's logits, HF's ``aux_loss`` and the z-loss of HF's router logits; and the
logged ``loss`` is their weighted sum."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from nxd.transforms import parallelize_model

sys.path.insert(0, str(Path(__file__).parent))
from mixtral_test_utils import batch, quiet_transformers, rel_err, save_hf  # noqa: E402

quiet_transformers()

Z_COEF = 0.01


def _hf_terms(hf_dir: Path, data: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    from transformers import MixtralForCausalLM

    model = MixtralForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    with torch.no_grad():
        out = model(data["input_ids"], output_router_logits=True)
    # ST-MoE's router z-loss: mean over tokens of logsumexp(router logits)^2, averaged over layers
    z = torch.stack([torch.logsumexp(r.float(), dim=-1).pow(2).mean() for r in out.router_logits]).mean()
    return {"lm_loss": F.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]), data["labels"].reshape(-1)),
            "aux_loss": out.aux_loss, "z_loss": z}


def test_step_loss_terms_match_transformers_and_add_up_to_the_loss(tmp_path):
    from nxd_core_parallel.trainer import NxDModel
    from nxd_models_mixtral import MixtralConfig, MixtralForCausalLM, load_hf_checkpoint

    src = save_hf(tmp_path / "hf")
    hf_config = json.loads((src / "config.json").read_text())
    config = MixtralConfig.from_dict({**hf_config, "moe": {"router_z_loss_coef": Z_COEF}})
    model = parallelize_model(MixtralForCausalLM(config))
    load_hf_checkpoint(model, str(src))
    micro_batches = [batch(seed=1), batch(seed=2)]

    sums: dict[str, torch.Tensor] = {}
    loss = float(NxDModel(model).run_train(*micro_batches, loss_terms=sums))
    logged = {name: float(value) / len(micro_batches) for name, value in sums.items()}  # as nxd train logs them
    assert sorted(logged) == ["aux_loss", "lm_loss", "z_loss"]

    recombined = logged["lm_loss"] + config.router_aux_loss_coef * logged["aux_loss"] + Z_COEF * logged["z_loss"]
    sum_err = abs(recombined - loss) / abs(loss)
    expected = [_hf_terms(src, mb) for mb in micro_batches]
    errors = {name: rel_err(torch.tensor(logged[name]), torch.stack([e[name] for e in expected]).mean())
              for name in logged}
    print(f"\nloss {loss:.6f} = lm + {config.router_aux_loss_coef} aux + {Z_COEF} z: relative error {sum_err:.2e}; "
          f"vs transformers: " + ", ".join(f"{n} {logged[n]:.6f} ({e:.2e})" for n, e in sorted(errors.items())))
    assert sum_err < 1e-6
    assert all(e < 1e-5 for e in errors.values()), errors


def test_no_router_terms_without_output_router_logits(tmp_path):
    from nxd_core_parallel.trainer import NxDModel
    from nxd_models_mixtral import MixtralConfig, MixtralForCausalLM

    config = json.loads((save_hf(tmp_path / "hf") / "config.json").read_text())
    model = parallelize_model(MixtralForCausalLM(MixtralConfig.from_dict({**config, "output_router_logits": False})))
    sums: dict[str, torch.Tensor] = {}
    NxDModel(model).run_train(batch(), loss_terms=sums)
    assert sums == {}  # the loss is the cross-entropy alone: nothing more to log
