"""Writes a tiny NxD Llama's initial weights as the checkpoint tag ``pretrained_weight`` that NxD's
TP/PP example loads with ``--pretrained_weight 1 --checkpoint_dir DIR``.

The example seeds every pipeline stage differently (``set_random_seed``), so a pipeline run and a
one-process run start from different weights; loading the same checkpoint gives both one start.
Run beside the example's modules: ``python -m nxd_compat.run make_pretrained_weight.py CONFIG_DIR CKPT_DIR``
(``--fuse_qkv 0`` after them: separate q/k/v projections, as NxD's fine-tuning .sh builds the model).
"""

import sys

import torch
import torch.distributed as dist
from transformers import LlamaConfig

import neuronx_distributed as nxd
from neuronx_distributed.parallel_layers import parallel_state

dist.init_process_group("gloo")  # run under torchrun (one process)
parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
from modeling_llama_nxd import LlamaForCausalLM  # noqa: E402  (needs the parallel state)

config = LlamaConfig.from_pretrained(sys.argv[1])
# the attributes run_llama_nxd.py sets at its default arguments (they decide parameter names)
config.use_cache, config.return_dict = False, False
config.sequence_parallel_enabled, config.qkv_linear, config.selective_checkpoint_enabled = False, False, False
config.kv_shared_group_size, config.use_flash_attention = 1, False
config.fuse_qkv = sys.argv[3:] != ["--fuse_qkv", "0"]
config.transpose_nki_inputs = True
config.head_dim = config.hidden_size // config.num_attention_heads
torch.manual_seed(0)
nxd.save_checkpoint(sys.argv[2], tag="pretrained_weight", model=LlamaForCausalLM(config))
