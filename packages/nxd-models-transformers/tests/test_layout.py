"""What the transformers path refuses, decided from the config and the class alone (before launch):
under pipeline parallelism, layers that need per-layer inputs the split cannot pass, a router loss
over every layer, fewer layers than stages; under TP, K/V heads that cannot be replicated."""

from __future__ import annotations

import pytest

from nxd.errors import ConfigError
from nxd_models_transformers.layout import check_layout, kv_size_multiplier
from nxd_models_transformers.spec import causal_lm_class, config_from_dict


def _config(model_type: str, **keys: object):
    return config_from_dict({"model_type": model_type, "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2,
                             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, **keys})


def test_pp_runs_for_a_decoder_lm_whose_layers_take_shared_arguments():
    config = _config("gemma3_text", layer_types=["sliding_attention", "full_attention"])
    check_layout(config, causal_lm_class(config), pp=2)


def test_pp_refuses_layers_taking_a_per_layer_input():
    config = _config("gemma3n_text", intermediate_size=[48, 48], layer_types=["sliding_attention", "full_attention"])
    with pytest.raises(ConfigError, match=r"pipeline_model_parallel_size=2: Gemma3nForCausalLM .* decoder layer "
                                          r"Gemma3nTextDecoderLayer takes 'per_layer_input'"):
        check_layout(config, causal_lm_class(config), pp=2)


def test_pp_refuses_a_router_loss_over_all_layers_and_fewer_layers_than_stages():
    config = _config("gpt_oss", num_local_experts=4, num_experts_per_tok=2, output_router_logits=True)
    with pytest.raises(ConfigError, match="adds a router load-balancing loss over all its layers"):
        check_layout(config, causal_lm_class(config), pp=2)
    config = _config("olmo2")
    with pytest.raises(ConfigError, match="num_hidden_layers=2; every pipeline stage needs a layer"):
        check_layout(config, causal_lm_class(config), pp=4)


def test_tp_refuses_heads_it_does_not_divide_naming_the_key_and_the_count():
    config = _config("olmo2")
    check_layout(config, causal_lm_class(config), tp=2)
    with pytest.raises(ConfigError, match=r"tensor_model_parallel_size=3 must divide Olmo2ForCausalLM .*'s "
                                          r"num_attention_heads=4: attention is sharded by whole heads"):
        check_layout(config, causal_lm_class(config), tp=3)


def test_kv_heads_fewer_than_tp_are_replicated_where_the_plan_shards_k_and_v_columnwise():
    config = _config("granite", num_key_value_heads=1)
    assert kv_size_multiplier(config, causal_lm_class(config), 2) == 2
    assert kv_size_multiplier(_config("granite"), causal_lm_class(config), 4) == 2
    assert kv_size_multiplier(_config("granite"), causal_lm_class(config), 2) == 1
    config = _config("olmo2", num_key_value_heads=1)  # q/k/v gathered whole (q/k norms over all heads)
    assert kv_size_multiplier(config, causal_lm_class(config), 2) == 1
    config = _config("granite", num_attention_heads=6, num_key_value_heads=3)  # 3 q heads per rank, 1.5 K/V
    with pytest.raises(ConfigError, match="num_key_value_heads=3 cannot be replicated over TP"):
        check_layout(config, causal_lm_class(config), tp=2)
    with pytest.raises(ConfigError, match="must divide .*num_attention_heads=4"):
        check_layout(_config("granite"), causal_lm_class(config), tp=8)


def test_meta_device_init_is_refused_by_the_build():
    """Materialised by reset_parameters (not transformers' _init_weights): refused."""
    import nxd
    from nxd_core_parallel.model_init import reset_parameters

    cfg = nxd.neuronx_distributed_config(model_init_config={"meta_device_init": True, "param_init_fn": reset_parameters})
    with pytest.raises(ConfigError, match="model.meta_device_init: Olmo2ForCausalLM is built with transformers' own"):
        nxd.get_model("transformers").build({**_config("olmo2").to_dict(), "model_type": "olmo2"}, cfg)
