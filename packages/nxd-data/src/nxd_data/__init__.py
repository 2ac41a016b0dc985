"""Tokenizers, indexed pretraining datasets, SFT data with packing, and DP samplers that resume exactly."""

__version__ = "0.1.0"
