"""Fixtures shared by the model parity tests: tiny HF models saved as folders, loaded by pagedcore."""

from __future__ import annotations

import pytest

from . import tiny_models


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory):
    """kind -> (hf_model, folder). Built once per session: each kind is saved and reused."""
    cache = {}

    def get(kind: str):
        if kind not in cache:
            hf_model = tiny_models.build_hf_model(kind)
            folder = tmp_path_factory.mktemp(f"tiny_{kind}")
            cache[kind] = (hf_model, tiny_models.save_hf_folder(hf_model, folder))
        return cache[kind]

    return get
