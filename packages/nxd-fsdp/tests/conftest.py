"""Shared helpers by name (fsdp_models.py; pytest runs in importlib mode). The four_ranks marker and
its scheduling live in nxd-testing's pytest plugin."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
