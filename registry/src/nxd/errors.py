"""Exceptions the core raises. Every message names the field, file or component involved."""

from __future__ import annotations


class NxdError(Exception):
    """Base class of nxd's own errors."""


class ConfigError(NxdError, ValueError):
    """An invalid configuration value; the message names the field and what would be valid."""


class PluginError(NxdError, RuntimeError):
    """A plugin could not be loaded, or two plugins conflict."""


class ComponentNotFound(NxdError, LookupError):
    """A named component is not installed; the message says which distribution provides it."""
