"""Sharded checkpoints with NxD's API: async save, retention, auto-resume, S3 storage, resharding on load."""

__version__ = "0.1.0"
