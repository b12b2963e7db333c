"""Fixtures for the bench command tests: a tiny random Llama folder (the engine tests' model)."""

from __future__ import annotations

import pytest

from tests.models import tiny_models


@pytest.fixture(scope="session")
def tiny_model_folder(tmp_path_factory) -> str:
    hf_model = tiny_models.build_hf_model("llama_tied")
    return tiny_models.save_hf_folder(hf_model, tmp_path_factory.mktemp("bench_tiny_llama"))
