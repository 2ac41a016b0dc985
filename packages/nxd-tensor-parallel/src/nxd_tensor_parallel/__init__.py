"""Tensor and sequence parallelism: NxD's TP/SP layers and collectives, the vocab-parallel loss, the one-device modules a plan shards and the plan engine (the parallel_plan and pad_model transforms)."""

__version__ = "0.1.0"
