"""``precision.type: fp8`` through ``nxd train``: refused before any rank starts where FP8 cannot
run (here: CPU without emulation), naming the key and the way out; with torchao's emulation a tiny
Llama trains with its blocks' linear layers in FP8 (one device, in-process)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from nxd.cli import main
from nxd_training.exp_manager import read_metrics

VOCAB = 512


@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from nxd_data.quickstart import prepare_quickstart_data

    root = tmp_path_factory.mktemp("fp8cli")
    corpus = prepare_quickstart_data(root / "corpus", vocab_size=VOCAB)
    config = {
        "name": "tiny", "seed": 7,
        "trainer": {"devices": 1, "max_steps": 3, "log_every_n_steps": 1, "val_check_interval": 0,
                    "enable_progress_bar": False, "accelerator": "cpu"},
        "exp_manager": {"exp_dir": str(root / "runs"), "create_checkpoint_callback": False},
        "data": {"module": "indexed", "data_prefix": corpus["data_prefix"], "tokenizer": corpus["tokenizer"],
                 "micro_batch_size": 2, "global_batch_size": 2, "seq_length": 32, "splits_string": "950,50,0"},
        "model": {"architecture": "llama", "vocab_size": VOCAB, "hidden_size": 32, "ffn_hidden_size": 64,
                  "num_layers": 2, "num_attention_heads": 4, "num_kv_heads": 2, "max_position_embeddings": 64,
                  "optim": {"name": "adamw", "lr": 1e-2, "sched": {"name": "constant"}}},
        "precision": {"type": "fp8"},
    }
    path = root / "cfg.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize(("overrides", "message"), [
    ([], "precision.type: fp8): FP8 matmuls (torch._scaled_mm) need an NVIDIA GPU of compute capability >= 8.9"),
    ([], "to check the wiring without FP8 hardware set precision.fp8.emulate=true"),
    (["precision.fp8={recipe: delayed}"], "recipe='delayed': torchao's float8 recipes are tensorwise, rowwise"),
    (["precision.type=fp32", "precision.fp8={emulate: true}"], "precision.fp8 holds FP8 options, and "
                                                               "precision.type=fp32: set precision.type=fp8"),
])
def test_refused_before_launch(config_file: Path, capsys, overrides: list[str], message: str) -> None:
    assert main(["train", str(config_file), "exp_manager.name=refused", *overrides]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (config_file.parent / "runs" / "refused").exists()  # no rank started, nothing written


@pytest.mark.launch
@pytest.mark.slow  # two in-process training runs (~23 s on 2 cores)
def test_emulated_fp8_trains(config_file: Path) -> None:
    runs = config_file.parent / "runs"
    assert main(["train", str(config_file), "exp_manager.name=emulated", "precision.fp8={emulate: true}"]) == 0
    assert main(["train", str(config_file), "exp_manager.name=bf16", "precision.type=autocast"]) == 0
    fp8, bf16 = (read_metrics(runs / name / "version_0") for name in ("emulated", "bf16"))
    assert [r["step"] for r in fp8] == [1, 2, 3] and fp8[-1]["loss"] < fp8[0]["loss"], fp8
    # the same model, data and bf16 autocast: the first loss differs only by the FP8 matmuls
    assert fp8[0]["loss"] != bf16[0]["loss"], (fp8[0], bf16[0])
