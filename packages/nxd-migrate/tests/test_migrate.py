"""Migration: an NNM config (Llama-7B, as NNM shipped it) and a NeMo one convert to nxd configs that
nxd-training's schema accepts, with every source key accounted for; the CLI's exit codes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from nxd.cli import main as nxd_main
from nxd_migrate import migrate_config
from nxd_migrate.config import _flatten
from nxd_migrate.nnm_checkpoint import read_nnm
from nxd_training.config import load_config, parse_config

NNM_LLAMA = """
name: megatron_llama
restore_from_path: null
trainer:
  devices: 32
  num_nodes: 4
  accelerator: tpu
  precision: 32
  logger: false
  enable_checkpointing: false
  replace_sampler_ddp: false
  max_epochs: null
  max_steps: 20000
  log_every_n_steps: 1
  val_check_interval: 20000
  limit_val_batches: 1
  limit_test_batches: 1
  accumulate_grad_batches: 1
  gradient_clip_val: 1.0
  benchmark: false
  enable_model_summary: true
exp_manager:
  log_local_rank_0_only: true
  create_tensorboard_logger: true
  explicit_log_dir: null
  exp_dir: null
  name: megatron_llama
  resume_if_exists: true
  resume_ignore_no_checkpoint: true
  create_checkpoint_callback: true
  checkpoint_callback_params:
    monitor: step
    save_top_k: 1
    mode: max
    always_save_nemo: false
    save_nemo_on_train_end: false
    filename: 'megatron_llama--{step}-{consumed_samples}'
    model_parallel_size: ${multiply:${model.tensor_model_parallel_size}, ${model.pipeline_model_parallel_size}}
    every_n_train_steps: 200
  log_parameter_norm: true
  log_gradient_norm: true
  save_xser: true
  load_xser: true
  async_checkpointing: false
model:
  micro_batch_size: 1
  global_batch_size: 256
  tensor_model_parallel_size: 8
  pipeline_model_parallel_size: 1
  virtual_pipeline_model_parallel_size: null
  encoder_seq_length: 4096
  max_position_embeddings: ${.encoder_seq_length}
  num_layers: 32
  hidden_size: 4096
  ffn_hidden_size: 11008
  num_attention_heads: 32
  num_kv_heads: 32
  init_method_std: 0.021
  use_scaled_init_method: true
  hidden_dropout: 0
  attention_dropout: 0
  ffn_dropout: 0
  kv_channels: null
  apply_query_key_layer_scaling: true
  normalization: rmsnorm
  layernorm_epsilon: 1.0e-05
  do_layer_norm_weight_decay: false
  make_vocab_size_divisible_by: 8
  pre_process: true
  post_process: true
  persist_layer_norm: true
  share_embeddings_and_output_weights: false
  position_embedding_type: rope
  rotary_percentage: 1
  activation: swiglu
  has_bias: false
  transformer_block_type: pre_ln
  tokenizer:
    library: huggingface
    type: /root/llama7b-hf
    model: null
    vocab_file: null
    merge_file: null
    delimiter: null
    sentencepiece_legacy: false
    use_fast: false
  native_amp_init_scale: 4294967296
  native_amp_growth_interval: 1000
  hysteresis: 2
  fp32_residual_connection: false
  fp16_lm_cross_entropy: false
  megatron_amp_O2: false
  grad_allreduce_chunk_size_mb: 125
  grad_div_ar_fusion: false
  gradient_accumulation_fusion: false
  bias_activation_fusion: false
  bias_dropout_add_fusion: false
  masked_softmax_fusion: false
  seed: 1234
  resume_from_checkpoint: null
  use_cpu_initialization: true
  onnx_safe: false
  apex_transformer_log_level: 30
  gradient_as_bucket_view: true
  sync_batch_comm: false
  activations_checkpoint_granularity: full
  activations_checkpoint_method: uniform
  activations_checkpoint_num_layers: 1
  num_micro_batches_with_partial_activation_checkpoints: null
  activations_checkpoint_layers_per_pipeline: null
  disable_layer_norm_checkpointing: true
  transformer_engine: false
  fp8: false
  sequence_parallel: true
  wrap_with_zero: true
  data:
    data_prefix: [1.0, /data/book/book_llama_text_sentence]
    index_mapping_dir: null
    data_impl: mmap
    splits_string: 980,10,10
    seq_length: ${model.encoder_seq_length}
    skip_warmup: true
    num_workers: 2
    dataloader_type: single
    reset_position_ids: false
    reset_attention_mask: false
    eod_mask_loss: false
    validation_drop_last: true
    no_seqlen_plus_one_input_tokens: false
    pad_samples_to_global_batch_size: false
  optim:
    name: adamw
    lr: 3.0e-4
    weight_decay: 0.1
    capturable: true
    betas: [0.9, 0.95]
    sched:
      name: CosineAnnealing
      warmup_steps: 2000
      constant_steps: 0
      min_lr: 3.0e-5
"""

NEMO_GPT = """
trainer: {devices: 8, num_nodes: 1, accelerator: gpu, precision: bf16-mixed, max_steps: 100,
          accumulate_grad_batches: 4}
model:
  mcore_gpt: true
  micro_batch_size: 2
  global_batch_size: 64
  tensor_model_parallel_size: 2
  num_layers: 4
  hidden_size: 256
  num_attention_heads: 8
  num_query_groups: 2
  rotary_base: 500000.0
  fp8: true
  mystery_knob: 3
  optim: {name: distributed_fused_adam, lr: 1.0e-3, overlap_grad_sync: true}
"""


def test_nnm_llama_config_converts_to_a_valid_nxd_config() -> None:
    raw = yaml.safe_load(NNM_LLAMA)
    out, report = migrate_config(raw)
    assert report.source_kind == "nnm"
    cfg = parse_config(out)  # nxd-training's schema (migrate_config checked it too)
    ds = cfg.distributed_strategy
    assert (ds.tensor_model_parallel_size, ds.pipeline_model_parallel_size, ds.zero1, ds.sequence_parallel) == (8, 1, True, True)
    assert (cfg.data.micro_batch_size, cfg.data.global_batch_size, cfg.data.seq_length) == (1, 256, 4096)
    assert cfg.data.tokenizer.type == "/root/llama7b-hf" and cfg.data.module == "indexed"
    assert cfg.data.model_extra["data_prefix"] == [1.0, "/data/book/book_llama_text_sentence"]
    assert cfg.model.max_position_embeddings == 4096 and cfg.model.num_kv_heads == 32
    assert cfg.model.architecture == "llama" and cfg.model_source == "megatron"
    assert cfg.model.optim.sched.name == "CosineAnnealing" and cfg.model.optim.betas == (0.9, 0.95)
    assert cfg.exp_manager.checkpoint_callback_params.model_parallel_size == 8
    assert cfg.precision.type == "fp32" and cfg.seed == 1234 and cfg.trainer.max_epochs == -1
    assert cfg.bucket_size_collectives == 125
    assert cfg.model.activations_checkpoint_granularity == "full"
    # only the scaled init changes training; the rest of NNM's GPU/fp16 knobs are removed with a reason
    assert [k for k, _, _ in report.unsupported] == ["model.use_scaled_init_method"]
    removed = {k for k, _, _ in report.removed}
    assert {"model.megatron_amp_O2", "model.bias_activation_fusion", "trainer.accumulate_grad_batches",
            "model.activations_checkpoint_method", "model.data.data_impl", "restore_from_path"} <= removed
    # every source key is accounted for exactly once
    leaves = [k for k, _ in _flatten(raw)]
    seen = [k for k, _ in report.moved] + [k for k, _, _ in report.removed] + [k for k, _, _ in report.unsupported]
    assert sorted(seen) == sorted(leaves)


def test_nemo_config_and_unsupported_keys() -> None:
    out, report = migrate_config(yaml.safe_load(NEMO_GPT))
    assert report.source_kind == "nemo"
    cfg = parse_config(out)
    assert cfg.distributed_strategy.zero1 is True and cfg.model.optim.name == "adamw"
    assert cfg.model.num_kv_heads == 2 and cfg.model.rope_theta == 500000.0
    assert cfg.precision.type == "autocast" and cfg.trainer.accelerator == "auto"
    unsupported = {k: v for k, v, _ in report.unsupported}
    assert unsupported == {"trainer.accumulate_grad_batches": 4, "model.fp8": True, "model.mystery_knob": 3}
    assert "mystery_knob" not in out["model"]


def test_cli_lists_unsupported_keys_and_sets_the_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src, dst = tmp_path / "nemo.yaml", tmp_path / "nxd.yaml"
    src.write_text(NEMO_GPT)
    assert nxd_main(["migrate", "config", str(src), "-o", str(dst)]) == 3
    printed = capsys.readouterr()
    assert "model.mystery_knob: 3" in printed.out and "unsupported" in printed.err
    text = dst.read_text()
    assert "#   model.fp8: True" in text  # the written file says what it left out
    assert load_config(str(dst), check=False).data.micro_batch_size == 2
    assert nxd_main(["migrate", "config", str(src), "-o", str(dst), "--allow-unsupported"]) == 0
    nnm = tmp_path / "nnm.yaml"
    nnm.write_text(NNM_LLAMA.replace("use_scaled_init_method: true", "use_scaled_init_method: false"))
    assert nxd_main(["migrate", "config", str(nnm), "-o", str(dst)]) == 0


def test_bad_input_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [1, 2\n")
    assert nxd_main(["migrate", "config", str(bad), "-o", str(tmp_path / "o.yaml")]) == 1
    assert "bad.yaml" in capsys.readouterr().err


def test_without_the_package_the_verb_names_it(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    import nxd.plugins

    monkeypatch.setenv("NXD_DISABLE_PLUGINS", "migrate")
    nxd.plugins.reset()
    try:
        with pytest.raises(SystemExit) as exit_info:
            nxd_main(["migrate", "config", "in.yaml", "-o", "out.yaml"])
        assert exit_info.value.code == 2
        assert "pip install nxd-migrate" in capsys.readouterr().err
        assert "nnm" not in nxd.list_components("checkpoint_converter")
    finally:
        monkeypatch.delenv("NXD_DISABLE_PLUGINS")
        nxd.plugins.reset()


def test_migrate_checkpoint_and_ckpt_convert_are_one_converter() -> None:
    import nxd

    assert nxd.get_checkpoint_converter("nnm").read is read_nnm
