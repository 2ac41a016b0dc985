"""DeepSeek-V3 under nxd-pipeline on real gloo ranks (1F1B, PP=2: the dense first layer and an MoE
layer on one stage, the other MoE layer on the next) against the same weights at PP=1 in one process
(gradient accumulation over the same micro-batches): loss and every gradient within 1e-5 relative
(fp32). ``seq_aux_loss_coef`` and ``mtp_depth`` under PP are refused when the plan places the model
(``DeepseekV3ForCausalLM.nxd_parallelized``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from deepseek_test_utils import SPEC, batch, save_hf  # noqa: E402

from nxd_testing.pipeline_reference import assert_pipeline_parity, pipeline_grads_body
from nxd_testing.reference import quiet_transformers

quiet_transformers()


def test_deepseek_v3_pp2_matches_pp1(rank_pool, tmp_path):
    src = save_hf(tmp_path / "hf", seed=2, num_hidden_layers=4)
    micro = [batch(seed=10 + i) for i in range(2)]
    loss, grad = assert_pipeline_parity(rank_pool(2).run(pipeline_grads_body, SPEC[0], str(src), micro, timeout=600))
    print(f"\ndeepseek_v3 PP=2 1f1b vs PP=1: loss rel {loss:.2e}, grads rel {grad:.2e}")
