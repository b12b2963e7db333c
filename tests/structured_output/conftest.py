"""Fixtures of the structured-output tests: a tiny random Llama (HF folder with a byte-level BPE
tokenizer) and an offline LLM on it, plus checks that an output follows its constraint.

Random weights write garbage, but under a constraint the garbage must still match it: the tests use
bounded constraints (enums, ranges, fixed-length regexes) so that every output also finishes.
"""

from __future__ import annotations

import pytest

from tests.models import tiny_models


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory):
    model = tiny_models.build_hf_model("llama")
    return tiny_models.save_hf_folder(model, tmp_path_factory.mktemp("structured_tiny_llama"))


@pytest.fixture(scope="session")
def tiny_llm(tiny_folder):
    from pagedcore import LLM

    return LLM(tiny_folder, kv_cache_memory="64MiB", max_model_len=256)
