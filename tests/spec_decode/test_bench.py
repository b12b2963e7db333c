"""The benchmark side: the input-grounded workload loads, and latency's side-by-side runs on a tiny model."""

from __future__ import annotations

import numpy as np

from pagedcore.benchmarks import machine
from pagedcore.benchmarks.latency import format_grounded, grounded_decode
from pagedcore.benchmarks.workloads import BenchRequest, make_workload
from pagedcore.engine.llm_engine import LLMEngine
from pagedcore.config import EngineConfig


def test_input_grounded_workload_is_bundled_and_copies_its_prompt():
    requests = make_workload("input-grounded", vocab_size=49152)
    assert len(requests) == 16 and all(r.ignore_eos for r in requests)
    assert len({tuple(r.prompt_token_ids) for r in requests}) == 16          # no duplicate prompts
    # Copying: most 4-grams of an answer occur earlier, in its prompt or its own earlier tokens.
    import json
    from pathlib import Path
    data = json.loads((Path(__file__).resolve().parents[2] / "bench/workloads/input_grounded.json").read_text())
    shares = []
    for r in data["requests"]:
        p, o = r["prompt_token_ids"], r["reference_output_token_ids"]
        h = p + o
        first = {}
        for i in range(len(h) - 3):
            first.setdefault(tuple(h[i:i + 4]), i)
        shares.append(np.mean([first[tuple(h[i:i + 4])] < i for i in range(len(p), len(h) - 3)]))
    assert np.median(shares) > 0.5


def test_latency_side_by_side_on_a_tiny_model(tiny_llama):
    _, folder = tiny_llama
    engine = LLMEngine(EngineConfig(model=folder, max_model_len=256,
                                    speculative_config={"method": "ngram", "num_speculative_tokens": 3}))
    prompt = list(range(20, 60)) * 2
    result = grounded_decode(engine, [BenchRequest(prompt, 24), BenchRequest(prompt[5:], 16)])
    assert result["off"]["decode_tokens"] == result["on"]["decode_tokens"] == 23 + 15
    assert result["acceptance"]["num_draft_tokens"] > 0 and result["speedup"] > 0
    assert engine.speculator is not None                                     # plugged back in
    text = format_grounded({"setup": {"dtype": "float32", "model": "tiny"}, "machine": machine.cpu_info(), "load_average": [1.0],
                            "workload_file": "x.json", "grounded": result})
    assert "speed-up" in text


def test_latency_side_by_side_with_draft_methods(tiny_llama):
    """bench latency's off/on alternation with a draft model (the target as its own draft: every draft
    accepted, even though the "off" runs leave prefix-cached blocks without the draft's KV) and layer_skip."""
    _, folder = tiny_llama
    prompt = list(range(20, 60)) * 2
    requests = [BenchRequest(prompt, 24), BenchRequest(prompt[5:], 16)]
    for spec in ({"method": "draft_model", "model": folder, "num_speculative_tokens": 3},
                 {"method": "layer_skip", "num_layers": 2, "num_speculative_tokens": 3}):
        engine = LLMEngine(EngineConfig(model=folder, max_model_len=256, speculative_config=spec))
        result = grounded_decode(engine, requests)
        assert result["off"]["decode_tokens"] == result["on"]["decode_tokens"] == 23 + 15
        assert result["acceptance"]["num_draft_tokens"] > 0
        if spec["method"] == "draft_model":
            assert result["acceptance"]["acceptance_rate"] == 1.0
