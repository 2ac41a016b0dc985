import os
import sys

# Tests import their shared helpers (ckpt_helpers.py) by name; pytest runs in importlib mode.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
