"""Errors raised by nxd-ckpt (subclasses of the core's NxdError so callers can catch one type)."""

from __future__ import annotations

from nxd.errors import NxdError


class CheckpointError(NxdError):
    """A checkpoint could not be saved or loaded; the message names the file, tensor or rank."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint file is truncated, corrupted, or holds content the safe loader refuses."""
