"""Where every nxd parameter of one TP rank comes from in a Hugging Face GPT-2 or GPT-NeoX checkpoint.

A *plan* lists, for one local parameter, the HF tensor pieces whose concatenation (along the nxd
parameter's dimension 0, or its only dimension) is that rank's shard. Import reads exactly those
slices; export gathers every rank's shard and writes each piece back, so both directions share
one description.

* GPT-2 stores ``Conv1D`` weights as ``[in, out]``: pieces marked ``transpose`` are read along the
  HF dimension that is the nxd output (rows) or input (columns) and transposed.
* GPT-2's ``c_attn`` is ``[q all heads | k all heads | v all heads]``; nxd's (Megatron's) fused
  QKV is per head ``[q_h; k_h; v_h]``, so the piece is a gather of columns.
* GPT-NeoX's ``query_key_value`` already is Megatron's per-head interleaved layout: a TP rank's
  rows are one contiguous slice.
* Query heads TP does not divide are padded with zero heads (NxD's ``pad_model``): a rank's
  zero heads come after its real ones and have no HF rows either (``zeros``).
* Padded vocabulary rows (Megatron padding) have no HF rows: a vocabulary piece's ``zeros`` rows
  are zeros on import and dropped on export.
"""

from __future__ import annotations

import re

from nxd_modeling.hf_pipeline import Piece
from nxd_models_gpt.config import GPTConfig

LAYOUTS = ("gpt2", "gpt_neox")


def _rows(key: str, start: int, stop: int, dim: int = 0, transpose: bool = False, zeros: int = 0) -> Piece:
    return Piece(key, dim, tuple(range(start, stop)), transpose, zeros)


def check_exportable(config: GPTConfig, layout: str) -> None:
    """Raise ``ValueError`` naming what the HF layout cannot express."""
    if layout not in LAYOUTS:
        raise ValueError(f"Hugging Face layout must be one of {list(LAYOUTS)}, got {layout!r}")
    problems = []
    if config.normalization != "LayerNorm":
        problems.append("normalization must be LayerNorm")
    if config.activation != "gelu":
        problems.append("activation must be gelu")
    if config.num_query_groups != config.num_attention_heads:
        problems.append("num_query_groups must equal num_attention_heads (MHA)")
    if not config.has_bias:
        problems.append("has_bias must be true")
    if config.transformer_block_type != "pre_ln":
        problems.append("transformer_block_type must be pre_ln")
    if config.kv_channels * config.num_attention_heads != config.hidden_size:
        problems.append("kv_channels x num_attention_heads must equal hidden_size")
    if layout == "gpt2":
        if config.position_embedding_type != "learned_absolute":
            problems.append("GPT-2 needs position_embedding_type learned_absolute")
        if config.parallel_residual:
            problems.append("GPT-2 has no parallel residual")
    else:
        if config.position_embedding_type != "rope":
            problems.append("GPT-NeoX needs position_embedding_type rope")
    if problems:
        raise ValueError(f"this GPT config has no {layout} Hugging Face layout: " + "; ".join(problems))


def default_layout(config: GPTConfig) -> str:
    return config.extra.get("hf_layout") or ("gpt_neox" if config.position_embedding_type == "rope" else "gpt2")


def _vocab_rows(key: str, config: GPTConfig, padded: int, tp: int, rank: int) -> list[Piece]:
    per = padded // tp
    lo, hi = rank * per, (rank + 1) * per
    real = range(lo, max(lo, min(hi, config.vocab_size)))
    return [Piece(key, 0, tuple(real), zeros=per - len(real))]


def hf_output_key(layout: str) -> str:
    """GPT-NeoX checkpoints (as transformers writes them) keep the untied head as ``embed_out``."""
    return "lm_head.weight" if layout == "gpt2" else "embed_out.weight"


_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


def plan_for(name: str, config: GPTConfig, layout: str, tp: int, rank: int, padded_vocab: int) -> list[Piece]:
    """The pieces that make nxd parameter ``name`` on TP ``rank`` of ``tp``."""
    gpt2 = layout == "gpt2"
    pre = "transformer." if gpt2 else "gpt_neox."
    tied_head = name == "output_layer.weight" and config.share_embeddings_and_output_weights
    if name == "embedding.word_embeddings.weight" or tied_head:  # a later pipeline stage's copy of the tied weight
        return _vocab_rows(pre + ("wte.weight" if gpt2 else "embed_in.weight"), config, padded_vocab, tp, rank)
    if name == "output_layer.weight":
        return _vocab_rows(hf_output_key(layout), config, padded_vocab, tp, rank)
    if name == "embedding.position_embeddings.weight" and gpt2:
        return [Piece(pre + "wpe.weight", None)]
    if name.startswith("decoder.final_layernorm."):
        return [Piece(pre + ("ln_f." if gpt2 else "final_layer_norm.") + name.rsplit(".", 1)[1], None)]
    match = _LAYER.match(name)
    if match is None:
        raise KeyError(f"{name}: no {layout} Hugging Face tensor for this parameter")
    i, rest = match.group(1), match.group(2)
    h, hd, ffn = config.hidden_size, config.kv_channels, config.ffn_hidden_size
    nq = config.num_attention_heads
    heads = -(-nq // tp)  # per rank, zero heads appended when TP does not divide them (pad_model)
    my_heads = range(min(rank * heads, nq), min((rank + 1) * heads, nq))
    pad = heads - len(my_heads)  # this rank's zero heads, after its real ones
    f_lo, f_hi = rank * ffn // tp, (rank + 1) * ffn // tp
    h_lo, h_hi = my_heads.start * hd, my_heads.stop * hd
    kind = rest.rsplit(".", 1)[1]  # weight / bias
    if gpt2:
        layer = f"{pre}h.{i}."
        norms = {"input_layernorm": "ln_1", "pre_mlp_layernorm": "ln_2"}
        if rest.split(".")[0] in norms:
            return [Piece(layer + norms[rest.split(".")[0]] + "." + kind, None)]
        if rest.startswith("self_attention.linear_qkv."):
            cols = tuple(part * h + g * hd + d for g in my_heads for part in range(3) for d in range(hd))
            key = layer + "attn.c_attn." + kind
            return [Piece(key, 1, cols, True, 3 * hd * pad)] if kind == "weight" else [Piece(key, 0, cols, zeros=3 * hd * pad)]
        if rest == "self_attention.linear_proj.weight":
            return [_rows(layer + "attn.c_proj.weight", h_lo, h_hi, 0, True, hd * pad)]
        if rest == "self_attention.linear_proj.bias":
            return [Piece(layer + "attn.c_proj.bias", None)]
        if rest == "mlp.linear_fc1.weight":
            return [_rows(layer + "mlp.c_fc.weight", f_lo, f_hi, 1, True)]
        if rest == "mlp.linear_fc1.bias":
            return [_rows(layer + "mlp.c_fc.bias", f_lo, f_hi)]
        if rest == "mlp.linear_fc2.weight":
            return [_rows(layer + "mlp.c_proj.weight", f_lo, f_hi, 0, True)]
        if rest == "mlp.linear_fc2.bias":
            return [Piece(layer + "mlp.c_proj.bias", None)]
    else:
        layer = f"{pre}layers.{i}."
        norms = {"input_layernorm": "input_layernorm", "pre_mlp_layernorm": "post_attention_layernorm"}
        if rest.split(".")[0] in norms:
            return [Piece(layer + norms[rest.split(".")[0]] + "." + kind, None)]
        if rest.startswith("self_attention.linear_qkv."):
            return [_rows(layer + "attention.query_key_value." + kind, 3 * hd * my_heads.start, 3 * hd * my_heads.stop,
                          zeros=3 * hd * pad)]
        if rest == "self_attention.linear_proj.weight":
            return [_rows(layer + "attention.dense.weight", h_lo, h_hi, 1, zeros=hd * pad)]
        if rest == "self_attention.linear_proj.bias":
            return [Piece(layer + "attention.dense.bias", None)]
        if rest == "mlp.linear_fc1.weight" or rest == "mlp.linear_fc1.bias":
            return [_rows(layer + "mlp.dense_h_to_4h." + kind, f_lo, f_hi)]
        if rest == "mlp.linear_fc2.weight":
            return [_rows(layer + "mlp.dense_4h_to_h.weight", f_lo, f_hi, 1)]
        if rest == "mlp.linear_fc2.bias":
            return [Piece(layer + "mlp.dense_4h_to_h.bias", None)]
    raise KeyError(f"{name}: no {layout} Hugging Face tensor for this parameter")


def hf_shapes(config: GPTConfig, layout: str) -> dict[str, tuple[int, ...]]:
    """Every tensor of the HF checkpoint and its shape."""
    h, ffn, v = config.hidden_size, config.ffn_hidden_size, config.vocab_size
    out: dict[str, tuple[int, ...]] = {}
    if layout == "gpt2":
        out["transformer.wte.weight"] = (v, h)
        out["transformer.wpe.weight"] = (config.max_position_embeddings, h)
        for i in range(config.num_layers):
            p = f"transformer.h.{i}."
            out.update({p + "ln_1.weight": (h,), p + "ln_1.bias": (h,), p + "attn.c_attn.weight": (h, 3 * h),
                        p + "attn.c_attn.bias": (3 * h,), p + "attn.c_proj.weight": (h, h), p + "attn.c_proj.bias": (h,),
                        p + "ln_2.weight": (h,), p + "ln_2.bias": (h,), p + "mlp.c_fc.weight": (h, ffn),
                        p + "mlp.c_fc.bias": (ffn,), p + "mlp.c_proj.weight": (ffn, h), p + "mlp.c_proj.bias": (h,)})
        out.update({"transformer.ln_f.weight": (h,), "transformer.ln_f.bias": (h,)})
    else:
        out["gpt_neox.embed_in.weight"] = (v, h)
        for i in range(config.num_layers):
            p = f"gpt_neox.layers.{i}."
            out.update({p + "input_layernorm.weight": (h,), p + "input_layernorm.bias": (h,),
                        p + "post_attention_layernorm.weight": (h,), p + "post_attention_layernorm.bias": (h,),
                        p + "attention.query_key_value.weight": (3 * h, h), p + "attention.query_key_value.bias": (3 * h,),
                        p + "attention.dense.weight": (h, h), p + "attention.dense.bias": (h,),
                        p + "mlp.dense_h_to_4h.weight": (ffn, h), p + "mlp.dense_h_to_4h.bias": (ffn,),
                        p + "mlp.dense_4h_to_h.weight": (h, ffn), p + "mlp.dense_4h_to_h.bias": (h,)})
        out.update({"gpt_neox.final_layer_norm.weight": (h,), "gpt_neox.final_layer_norm.bias": (h,)})
    if not config.share_embeddings_and_output_weights:
        out[hf_output_key(layout)] = (v, h)
    return out


#: Other spellings of an HF key accepted on import (GPT-NeoX heads appear under both names).
HF_KEY_ALIASES = {"embed_out.weight": "lm_head.weight", "lm_head.weight": "embed_out.weight"}


def to_hf_config(config: GPTConfig, layout: str) -> dict:
    """A ``config.json`` that transformers' ``GPT2LMHeadModel`` / ``GPTNeoXForCausalLM`` reads."""
    check_exportable(config, layout)
    act = "gelu_new" if config.openai_gelu else "gelu"
    if layout == "gpt2":
        return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": config.vocab_size,
                "n_embd": config.hidden_size, "n_inner": config.ffn_hidden_size, "n_layer": config.num_layers,
                "n_head": config.num_attention_heads, "n_positions": config.max_position_embeddings,
                "layer_norm_epsilon": config.layernorm_epsilon, "activation_function": act,
                "resid_pdrop": config.hidden_dropout, "embd_pdrop": config.hidden_dropout,
                "attn_pdrop": config.attention_dropout, "initializer_range": config.init_method_std,
                "tie_word_embeddings": config.share_embeddings_and_output_weights, "torch_dtype": config.dtype,
                "bos_token_id": None, "eos_token_id": None}
    return {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "vocab_size": config.vocab_size,
            "hidden_size": config.hidden_size, "intermediate_size": config.ffn_hidden_size,
            "num_hidden_layers": config.num_layers, "num_attention_heads": config.num_attention_heads,
            "max_position_embeddings": config.max_position_embeddings, "layer_norm_eps": config.layernorm_epsilon,
            "hidden_act": act, "use_parallel_residual": config.parallel_residual,
            "rotary_pct": config.rotary_percentage, "rotary_emb_base": config.rotary_base,
            "rope_parameters": {"rope_type": "default", "rope_theta": config.rotary_base,
                                "partial_rotary_factor": config.rotary_percentage},
            "attention_bias": True, "hidden_dropout": config.hidden_dropout,
            "attention_dropout": config.attention_dropout, "initializer_range": config.init_method_std,
            "tie_word_embeddings": config.share_embeddings_and_output_weights, "torch_dtype": config.dtype,
            "bos_token_id": None, "eos_token_id": None}
