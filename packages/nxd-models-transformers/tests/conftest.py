"""Shared helpers by name (families.py; pytest runs in importlib mode)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
