"""Runnable examples of the Lightning integration."""
