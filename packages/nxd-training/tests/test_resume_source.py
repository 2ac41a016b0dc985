"""``exp_manager.resume_from_checkpoint`` naming a folder of checkpoints (what ``nxd ckpt convert
--to nxd`` writes, or a run's ``checkpoints/``) means its newest complete checkpoint: it validated,
then every rank refused it as "incomplete (no 'done' marker)" (found by the composition matrix)."""

from __future__ import annotations

from pathlib import Path

import torch

from nxd.cli import main
from nxd_training.exp_manager import split_checkpoint_path


def test_converted_folder_resolves_to_its_newest_complete_checkpoint(tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    hf = tmp_path / "hf"
    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1)).save_pretrained(hf)
    out = tmp_path / "nxd"
    assert main(["ckpt", "convert", "--from", "hf", "--to", "nxd", "--input", str(hf), "--output", str(out),
                 "--model", "llama"]) == 0
    parent, tag = split_checkpoint_path(str(out))
    assert parent == str(out) and (out / tag / "done").is_file()
    assert split_checkpoint_path(str(out / tag)) == (str(out), tag)  # one checkpoint named: as before
    assert split_checkpoint_path("s3://bucket/run/checkpoints/step2") == ("s3://bucket/run/checkpoints", "step2")
