"""The loader tests reuse the tiny HF models of tests/models (tiny_models.py)."""

import sys
from pathlib import Path

_MODELS_DIR = str(Path(__file__).resolve().parent.parent / "models")
if _MODELS_DIR not in sys.path:
    sys.path.insert(0, _MODELS_DIR)
