"""Tokenizers, indexed pretraining datasets, SFT data with packing, and DP samplers that resume exactly.

Public entry points: :func:`nxd_data.tokenizers.load_tokenizer`,
:func:`nxd_data.prepare.prepare_dataset`, :func:`nxd_data.train_tokenizer.train_bpe_tokenizer`,
:func:`nxd_data.quickstart.prepare_quickstart_data`, and the data modules ``indexed`` / ``sft``
(:mod:`nxd_data.factories`). Importing this package does not import torch.
"""

__version__ = "0.1.0"
