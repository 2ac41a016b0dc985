"""What the parity tests share: learnable token data, the plain-torch training loop a parallel run
must match and the data-parallel loop that runs on the ranks, relative-error helpers, and the
comparison of a model family's logits, loss and gradients with its transformers oracle."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist


def token_chain_batch(step: int, *, batch: int, seq: int, vocab: int, mult: int = 3, add: int = 1,
                      seed: int = 100) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, labels)`` ``[batch, seq]`` of a learnable sequence: each next token is
    ``(mult * token + add) % vocab`` from a random start drawn with seed ``seed + step``."""
    g = torch.Generator().manual_seed(seed + step)
    tokens = [torch.randint(0, vocab, (batch,), generator=g)]
    for _ in range(seq):
        tokens.append((mult * tokens[-1] + add) % vocab)
    ids = torch.stack(tokens, dim=1)
    return ids[:, :-1], ids[:, 1:]


@dataclass
class ReferenceRun:
    """What :func:`train_reference` measured, one entry per step."""

    losses: list[float] = field(default_factory=list)
    #: total gradient norms before clipping (only when ``max_norm`` was given)
    grad_norms: list[float] = field(default_factory=list)


def train_reference(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: Iterable[Any], *,
                    max_norm: float | None = None,
                    loss_of: Callable[[torch.nn.Module, Any], torch.Tensor] | None = None) -> ReferenceRun:
    """The plain-torch loop: per batch ``loss = model(*batch)`` (or ``loss_of(model, batch)``),
    backward, optional ``clip_grad_norm_``, ``step``, ``zero_grad``."""
    run = ReferenceRun()
    for batch in batches:
        loss = loss_of(model, batch) if loss_of is not None else model(*batch)
        loss.backward()
        if max_norm is not None:
            run.grad_norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)))
        optimizer.step()
        optimizer.zero_grad()
        run.losses.append(float(loss.detach()))
    return run


def _rows(batch: Any, rank: int, size: int) -> Any:
    """Data-parallel rank ``rank``'s share (dim 0) of a tuple or dict of tensors."""
    def cut(t: torch.Tensor) -> torch.Tensor:
        per = t.shape[0] // size
        return t[rank * per:(rank + 1) * per]

    return {k: cut(v) for k, v in batch.items()} if isinstance(batch, Mapping) else tuple(cut(t) for t in batch)


def train_data_parallel(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: Iterable[Any], *,
                        group: Any = None,
                        loss_of: Callable[[torch.nn.Module, Any], torch.Tensor] | None = None,
                        after_step: Callable[[], None] | None = None) -> ReferenceRun:
    """The ranks' side of a parity test: per batch (tuple or dict of tensors, split along dim 0 over
    the data-parallel ``group``), this rank's rows through ``model.run_train(*rows)`` (or
    ``loss_of(model, rows)``, which backpropagates nothing: its loss is backpropagated here), then
    ``optimizer.step()`` and ``zero_grad()``. Records the DP-mean loss and ``optimizer.grad_norm``
    (when it has one), then calls ``after_step()`` (e.g. to record the weights). Collective over ``group``."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    run = ReferenceRun()
    for batch in batches:
        rows = _rows(batch, rank, size)
        if loss_of is None:
            loss = model.run_train(*rows)
        else:
            loss = loss_of(model, rows)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        loss = loss.detach().clone()
        dist.all_reduce(loss, group=group)
        run.losses.append(float(loss) / size)
        if getattr(optimizer, "grad_norm", None) is not None:
            run.grad_norms.append(float(optimizer.grad_norm))
        if after_step is not None:
            after_step()
    return run


def max_rel(got: Sequence[float] | Mapping[Any, float], want: Sequence[float] | Mapping[Any, float]) -> float:
    """Largest ``|got - want| / |want|`` over paired values (lists by position, dicts by key)."""
    if isinstance(want, Mapping):
        assert isinstance(got, Mapping) and got.keys() == want.keys(), (sorted(got), sorted(want))
        pairs = [(got[k], want[k]) for k in want]
    else:
        assert len(got) == len(want), (len(got), len(want))
        pairs = list(zip(got, want))
    return max(abs(a - b) / abs(b) for a, b in pairs)


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``max|actual - expected| / max|expected|`` in fp64 (the plain difference when ``expected`` is 0)."""
    scale = expected.abs().max().item()
    diff = (actual.double() - expected.double()).abs().max().item()
    return diff / scale if scale else diff


def parity_errors(result: Mapping[str, Any], ref: Mapping[str, Any]) -> dict[str, float]:
    """:func:`rel_err` of ``result`` against the oracle ``ref`` for ``logits`` (same shape required),
    ``loss``, ``aux_loss`` when ``result`` has one, and every gradient of ``ref["grads"]`` (the
    same names required), keyed by those names."""
    assert result["logits"].shape == ref["logits"].shape, (result["logits"].shape, ref["logits"].shape)
    errors = {key: rel_err(result[key], ref[key]) for key in ("logits", "loss", "aux_loss") if key in result}
    assert set(result["grads"]) == set(ref["grads"]), set(result["grads"]) ^ set(ref["grads"])
    for name, grad in ref["grads"].items():
        errors[name] = rel_err(result["grads"][name], grad)
    return errors


def assert_parity(result: Mapping[str, Any], ref: Mapping[str, Any], tol: float = 1e-5) -> float:
    """The worst of :func:`parity_errors`, asserted ``<= tol`` (the message names it)."""
    errors = parity_errors(result, ref)
    worst = max(errors, key=errors.get)
    assert errors[worst] <= tol, f"{worst}: relative error {errors[worst]:.3g} > {tol} (all: {errors})"
    return errors[worst]


def grads_into_parameters(model: torch.nn.Module) -> None:
    """Replace every parameter's data by its gradient, so the model's own (TP/EP-gathering) Hugging
    Face exporter returns full, HF-named gradients."""
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.grad.detach().clone()


def forward_backward_result(model: torch.nn.Module, data: Mapping[str, torch.Tensor], *,
                            gather_logits: Callable[[torch.Tensor], torch.Tensor],
                            export_grads: Callable[[torch.nn.Module], dict[str, torch.Tensor]],
                            sync_grads: Callable[[list[torch.Tensor]], None] | None = None) -> dict[str, Any]:
    """The parallel side of a Hugging Face parity check (compare with :func:`assert_parity`):
    ``model(input_ids, labels=labels)`` and backward, ``sync_grads(parameters)`` (e.g. the
    sequence-parallel all-reduce), then the full logits (``gather_logits(out.logits)``), the loss,
    ``aux_loss`` when the output has one, and the full HF-named gradients (``export_grads(model)``
    after :func:`grads_into_parameters`; collective when the exporter is)."""
    out = model(data["input_ids"], labels=data["labels"])
    out.loss.backward()
    if sync_grads is not None:
        sync_grads(list(model.parameters()))
    result = {"logits": gather_logits(out.logits).detach(), "loss": out.loss.detach()}
    if getattr(out, "aux_loss", None) is not None:
        result["aux_loss"] = out.aux_loss.detach()
    grads_into_parameters(model)
    result["grads"] = export_grads(model)
    return result


def quiet_transformers() -> None:
    """No progress bars or warnings from transformers, the oracle (imported here, on use)."""
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()


def random_lm_batch(seed: int, batch: int, seq: int, vocab: int) -> dict[str, torch.Tensor]:
    """``{"input_ids", "labels"}`` ``[batch, seq]`` of random tokens (labels aligned, not learnable)."""
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, vocab, (batch, seq), generator=g),
            "labels": torch.randint(0, vocab, (batch, seq), generator=g)}


def checkpoint_named_grads(model: torch.nn.Module, expert_names: Sequence[str] = ("gate_proj", "up_proj", "down_proj"),
                           moe_module: str = "mlp") -> dict[str, torch.Tensor]:
    """A transformers model's gradients named as its checkpoint names the weights: transformers 5
    keeps experts stacked in memory (``mlp.experts.gate_up_proj`` ``[E, 2I, H]``, ``down_proj``
    ``[E, H, I]``); the checkpoint holds ``{moe_module}.experts.{e}.{gate,up,down}.weight`` per expert
    (``expert_names``) and the router as ``{moe_module}.gate.weight``."""
    gate, up, down = expert_names
    out = {}
    for name, p in model.named_parameters():
        g = p.grad.detach().clone()
        name = name.replace(".mlp.gate.", f".{moe_module}.gate.")
        if ".mlp.experts.gate_up_proj" in name:
            prefix = name.replace(".mlp.experts.gate_up_proj", f".{moe_module}.experts.")
            inter = g.shape[1] // 2
            for e in range(g.shape[0]):
                out[f"{prefix}{e}.{gate}.weight"], out[f"{prefix}{e}.{up}.weight"] = g[e, :inter], g[e, inter:]
        elif ".mlp.experts.down_proj" in name:
            prefix = name.replace(".mlp.experts.down_proj", f".{moe_module}.experts.")
            for e in range(g.shape[0]):
                out[f"{prefix}{e}.{down}.weight"] = g[e]
        else:
            out[name] = g
    return out


def save_hf_oracle(model: torch.nn.Module, out: Any, spread_norms: bool = False) -> Any:
    """Save a randomly initialised transformers model as a parity oracle to ``out``, after drawing
    the weights HF initialises to (near) constants so every piece counts: experts and routers
    ``N(0, 0.2)``, and with ``spread_norms`` norm weights ``U(0.5, 1.5)`` (HF starts them at 1)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if spread_norms and "norm" in name:
                p.uniform_(0.5, 1.5)
            elif "experts" in name or name.endswith("gate.weight"):
                p.normal_(0.0, 0.2)
    model.save_pretrained(str(out))
    return out


class AdamWStepBound:
    """How far one AdamW step of a parallel fp32 run may land from an fp64 reference step taken from
    the same weights (teacher forcing: the reference starts every step from the parallel run's
    weights, so nothing compounds over steps). Adam divides by the gradient's own magnitude, so a
    weight whose gradient is a near-cancelling sum carries that sum's rounding noise straight into its
    update: a fixed tolerance on weights after AdamW steps is a number one machine printed.

    Derivation, per element and step ``t``:

    - at identical weights the parallel run's gradient differs from the fp64 one by at most
      ``delta = grad_tol x max|g|`` of its tensor, the bound every gradient parity test asserts
      (``grad_tol`` 1e-5); ``delta`` is the largest over the steps so far, as ``m`` and ``v``
      remember earlier gradients;
    - AdamW's update is ``lr x m_hat / (sqrt(v_hat) + eps)``; gradient errors up to ``delta`` move
      ``m_hat`` by at most ``delta`` (its weights sum to 1) and ``v_hat`` by at most
      ``2 delta sqrt(v_hat)`` (Cauchy-Schwarz), so the ratio by at most
      ``(1 + B_t) x delta / (sqrt(v_hat) + eps)`` to first order, where ``B_t`` bounds
      ``|m_hat| / sqrt(v_hat)`` (Cauchy-Schwarz over the exponential sums:
      ``(1 - b1) / sqrt(1 - b2) x sqrt(sum_j<t (b1^2 / b2)^j) x sqrt(1 - b2^t) / (1 - b1^t)``),
      and never by more than ``2 x B_t`` (the whole update, reversed);
    - plus the fp32 arithmetic of the step itself: ``4 x eps32 x (|w| + lr x B_t)``.

    Use: on the reference's fp64 ``torch.optim.AdamW``, call :meth:`grads_ready` after backward
    (and clipping) and :meth:`stepped` after ``step()``: it returns each parameter's per-element
    bound for that step."""

    EPS32 = torch.finfo(torch.float32).eps

    def __init__(self, optimizer: torch.optim.Optimizer, grad_tol: float = 1e-5) -> None:
        self.optimizer, self.grad_tol = optimizer, grad_tol
        self._delta: dict[torch.Tensor, float] = {}

    def grads_ready(self) -> None:
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    delta = self.grad_tol * float(p.grad.detach().abs().max())
                    self._delta[p] = max(delta, self._delta.get(p, 0.0))

    @staticmethod
    def ratio_bound(step: int, beta1: float, beta2: float) -> float:
        """``B_t``: the largest ``|m_hat| / sqrt(v_hat)`` Adam can produce after ``step`` steps."""
        series = sum((beta1 * beta1 / beta2) ** j for j in range(step))
        return (1 - beta1) / (1 - beta2) ** 0.5 * series ** 0.5 * (1 - beta2 ** step) ** 0.5 / (1 - beta1 ** step)

    def stepped(self) -> dict[torch.Tensor, torch.Tensor]:
        bounds = {}
        for group in self.optimizer.param_groups:
            lr, (beta1, beta2), eps = float(group["lr"]), group["betas"], group["eps"]
            for p in group["params"]:
                if p not in self._delta or p not in self.optimizer.state:
                    continue
                state = self.optimizer.state[p]
                step = int(state["step"])
                ratio = self.ratio_bound(step, beta1, beta2)
                v_hat = state["exp_avg_sq"].detach().double() / (1 - beta2 ** step)
                noise = ((1 + ratio) * self._delta[p] / (v_hat.sqrt() + eps)).clamp(max=2 * ratio)
                bounds[p] = lr * noise + 4 * self.EPS32 * (p.detach().double().abs() + lr * ratio)
        return bounds


def within_bound(got: Mapping[str, torch.Tensor], want: Mapping[str, torch.Tensor],
                 bound: Mapping[str, torch.Tensor]) -> tuple[float, str]:
    """The largest ``|got - want| / bound`` over every element (same names required) and its tensor."""
    assert set(got) == set(want) == set(bound), set(got) ^ set(want) ^ set(bound)
    used = {k: float(((got[k].double() - want[k].double()).abs() / bound[k]).max()) for k in want}
    worst = max(used, key=used.get)
    return used[worst], worst


def hf_lm_reference(hf_dir: Any, data: Mapping[str, torch.Tensor], shards: int = 1) -> dict[str, Any]:
    """The transformers side of a causal-LM parity check, in one process: the checkpoint in
    ``hf_dir`` (``AutoModelForCausalLM``, fp32) on ``data`` split into ``shards`` data-parallel
    micro-batches; the loss is the mean over them of cross-entropy on aligned labels, plus
    ``router_aux_loss_coef`` x HF's ``aux_loss`` when the config has ``output_router_logits``;
    backward once. Returns ``logits`` (all rows), ``loss``, ``aux_loss`` (one shard, MoE only),
    checkpoint-named ``grads`` (:func:`checkpoint_named_grads`; a tied LM head left out) and their
    global ``norm``."""
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    coef = model.config.router_aux_loss_coef if getattr(model.config, "output_router_logits", False) else 0.0
    per = data["input_ids"].shape[0] // shards
    total, logits, aux = 0.0, [], []
    for i in range(shards):
        ids, labels = data["input_ids"][i * per:(i + 1) * per], data["labels"][i * per:(i + 1) * per]
        out = model(ids, output_router_logits=True) if coef else model(ids)
        loss = F.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]), labels.reshape(-1))
        if coef:
            loss = loss + coef * out.aux_loss
            aux.append(out.aux_loss.detach())
        total = total + loss / shards
        logits.append(out.logits.detach())
    total.backward()
    grads = checkpoint_named_grads(model)
    if getattr(model.config, "tie_word_embeddings", False):
        grads.pop("lm_head.weight", None)
    ref = {"logits": torch.cat(logits), "loss": total.detach(), "grads": grads,
           "norm": torch.sqrt(sum(g.double().pow(2).sum() for g in grads.values()))}
    if len(aux) == 1:
        ref["aux_loss"] = aux[0]
    return ref


def build_from_hf(spec_name: str, hf_dir: Any, sequence_parallel: bool = False) -> tuple[Any, torch.nn.Module]:
    """``(spec, model)``: the registered model ``spec_name`` built for the current parallel state
    from ``hf_dir``'s ``config.json`` and loaded with its weights (``spec.load_hf``)."""
    import json
    from pathlib import Path

    import nxd

    spec = nxd.get_model(spec_name)
    config = json.loads((Path(hf_dir) / "config.json").read_text())
    model = nxd.build_parallel_model(spec, config, {"sequence_parallel": sequence_parallel})
    spec.load_hf(model, str(hf_dir))
    return spec, model


def _resolve(path: str) -> Any:
    """``"package.module:attribute"`` -> the attribute (a picklable way to name a function)."""
    import importlib

    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def parallel_grads_body(tp: int, ep: int, spec_name: str, export: str, hf_dir: str, data: Mapping[str, torch.Tensor],
                        sequence_parallel: bool = False, checkpointing: bool = False,
                        drop: Sequence[str] = (), cp: int = 1) -> dict[str, Any] | None:
    """Every rank of a parity test against :func:`hf_lm_reference`: TP ``tp`` x EP ``ep``, its
    data-parallel shard of ``data``, forward/backward (full activation checkpointing of the spec's
    blocks when asked), each CP rank (``cp``) its chunks of every sequence, NxDOptimizer's gradient
    sync; global rank 0 returns the DP-mean ``loss``,
    the full checkpoint-named ``grads`` (``export``, ``"module:function"``, gathers them; names
    ending in one of ``drop``, e.g. buffers, left out) and the global gradient ``norm``."""
    from nxd_core_parallel import parallel_state
    from nxd_core_parallel.grads import get_grad_norm
    from nxd_core_parallel.trainer import NxDOptimizer

    context = parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, expert_model_parallel_size=ep,
                                                       context_parallel_size=cp)
    dp, d = context.dp.size, context.dp.rank
    per = data["input_ids"].shape[0] // dp
    shard = {k: v[d * per:(d + 1) * per] for k, v in data.items()}
    if cp > 1:  # this CP rank's two chunks of every sequence, with their positions
        from nxd_context_parallel import split_batch_for_context_parallel

        shard = split_batch_for_context_parallel(shard, context.cp.rank, cp)
    spec, model = build_from_hf(spec_name, hf_dir, sequence_parallel)
    if checkpointing:
        from nxd_core_parallel.activation_checkpoint import apply_activation_checkpointing

        assert apply_activation_checkpointing(model, spec.transformer_layer_classes) > 0
    out = model(shard["input_ids"], labels=shard["labels"], position_ids=shard.get("position_ids"))
    out.loss.backward()
    opt = NxDOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                       {"optimizer_config": {"grad_clipping": False}, "sequence_parallel": sequence_parallel},
                       overlap_grad_sync=False, context=context)
    opt.sync_gradients()
    norm = get_grad_norm(list(model.parameters()), context=context)
    loss = out.loss.detach().clone()
    dist.all_reduce(loss, group=context.dp.group)
    grads_into_parameters(model)
    grads = {k: v for k, v in _resolve(export)(model).items() if not k.endswith(tuple(drop))}
    return {"loss": loss / dp, "grads": grads, "norm": norm} if dist.get_rank() == 0 else None


def parallel_logits_body(tp: int, spec_name: str, export: str, hf_dir: str, data: Mapping[str, torch.Tensor],
                         drop: Sequence[str] = (),
                         gather: str = "nxd_models_llama:gather_vocab_logits") -> dict[str, Any] | None:
    """Every rank of a TP ``tp`` parity test against :func:`hf_lm_reference` on the whole batch
    (compare with :func:`parity_errors`): the registered model ``spec_name`` imported from
    ``hf_dir``; global rank 0 returns :func:`forward_backward_result` (full logits by ``gather``,
    loss, checkpoint-named gradients by ``export``, names ending in one of ``drop`` left out). At
    ``tp`` 1 it also runs in a process without ``torch.distributed`` (the test's own)."""
    from nxd_core_parallel import parallel_state

    if tp > 1 or dist.is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    _, model = build_from_hf(spec_name, hf_dir)
    result = forward_backward_result(
        model, data, gather_logits=_resolve(gather),
        export_grads=lambda m: {k: v for k, v in _resolve(export)(m).items() if not k.endswith(tuple(drop))})
    return result if not dist.is_initialized() or dist.get_rank() == 0 else None


def max_abs_logits_diff(result: Mapping[str, Any], ref: Mapping[str, Any]) -> float:
    """``max |logits - reference logits|`` (what a parity report states next to the relative error)."""
    return float((result["logits"].double() - ref["logits"].double()).abs().max())


#: config keys that may differ between a checkpoint and its re-export without changing the model:
#: versions and paths, the storage dtype, and remote code (an export holds none)
CONFIG_KEYS_NOT_COMPARED = ("transformers_version", "_name_or_path", "dtype", "torch_dtype", "auto_map")


def assert_config_preserved(src: Any, out: Any) -> None:
    """transformers reads the exported ``config.json`` as the source's: every attribute of
    ``AutoConfig.from_pretrained(src)`` has the same value in the export's (a key written by
    neither side means the same default to both), save :data:`CONFIG_KEYS_NOT_COMPARED`."""
    from transformers import AutoConfig

    want = AutoConfig.from_pretrained(str(src)).to_dict()
    got = AutoConfig.from_pretrained(str(out)).to_dict()
    differ = {k: (v, got.get(k, "<missing>")) for k, v in want.items()
              if k not in CONFIG_KEYS_NOT_COMPARED and got.get(k, "<missing>") != v}
    assert not differ, f"export config.json differs from {src}'s (source, export): {differ}"


def assert_parallel_parity(result: Mapping[str, Any], ref: Mapping[str, Any], tol: float = 1e-5) -> float:
    """The worst relative error of a :func:`parallel_grads_body` result against
    :func:`hf_lm_reference` (loss, gradient norm, every gradient), asserted ``<= tol``."""
    errors = {"loss": rel_err(result["loss"], ref["loss"]), "grad_norm": rel_err(result["norm"], ref["norm"])}
    assert set(result["grads"]) == set(ref["grads"]), set(result["grads"]) ^ set(ref["grads"])
    errors.update({k: rel_err(result["grads"][k], g) for k, g in ref["grads"].items()})
    worst = max(errors, key=errors.get)
    assert errors[worst] <= tol, f"{worst}: relative error {errors[worst]:.3g} > {tol}"
    return errors[worst]


def assert_export_roundtrip(spec: Any, model: torch.nn.Module, src: Any, out: Any, prompt: torch.Tensor,
                            new_tokens: int = 12) -> None:
    """``spec.save_hf(model, out)`` of a model imported from ``src`` writes the same tensors as
    ``src`` and a config.json with every source key's value (:func:`assert_config_preserved`), transformers reloads it with the same logits, and ``spec.generate`` greedily continues
    ``prompt`` exactly as ``transformers.generate`` does."""
    from pathlib import Path

    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    spec.save_hf(model, str(out))
    assert_config_preserved(src, out)
    a, b = load_file(str(Path(src) / "model.safetensors")), load_file(str(Path(out) / "model.safetensors"))
    assert set(a) == set(b), set(a) ^ set(b)
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]
    hf = AutoModelForCausalLM.from_pretrained(str(src))
    assert torch.equal(AutoModelForCausalLM.from_pretrained(str(out))(prompt).logits, hf(prompt).logits)
    assert spec.generate(model, prompt, new_tokens).equal(hf.generate(prompt, max_new_tokens=new_tokens, do_sample=False))
