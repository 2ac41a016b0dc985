import os
import sys

# Tests import their helper (legacy_env.py) by name; pytest runs in importlib mode.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
