"""Pipeline parallelism: stage partitioning and pluggable schedules (GPipe, 1F1B, interleaved, zero-bubble)."""

__version__ = "0.1.0"
