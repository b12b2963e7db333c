"""bench/bench_structured.py's pieces on the tiny model: the side-by-side measurement returns a rate
per round for both runs with matched lengths, and the vLLM side is optional (a reason, not an error,
where vLLM is not installed, as in CI)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_structured", BENCH / "bench_structured.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_measure_schema_runs_both_sides_each_round(tiny_llm):
    bench = load_bench()
    tokenizer = tiny_llm.get_tokenizer()
    requests = [{"prompt_token_ids": tokenizer.encode(text), "max_tokens": 40}
                for text in ("The quick brown", "fox jumps", "over the lazy dog")]
    schema = {"type": "object", "properties": {"animal": {"enum": ["fox", "dog"]}}, "required": ["animal"]}
    rates = bench.measure_schema(tiny_llm, requests, schema, rounds=2, name="tiny")
    paired = rates.pop("paired step ratio")
    assert set(rates) == {"unconstrained", "json schema"}
    assert all(len(v) == 2 and all(r > 0 for r in v) for v in rates.values())
    assert paired > 0 and not tiny_llm.llm_engine.step_listeners     # its step listener is removed


def test_the_paired_step_ratio_pairs_steps_by_index():
    bench = load_bench()
    steps = {"unconstrained": [[1.0, 2.0], [1.0, 4.0], [9.0, 2.0]],     # medians 1, 2: 3 s
             "json schema": [[2.0, 2.0], [2.0, 2.0], [2.0, 2.0, 5.0]]}  # 2, 2 (the extra step dropped): 4 s
    assert bench.paired_step_ratio(steps) == 0.75


def test_the_vllm_side_is_optional(monkeypatch):
    bench = load_bench()
    monkeypatch.syspath_prepend(str(BENCH))
    import side_by_side

    monkeypatch.setattr(side_by_side, "VLLM_PYTHON", "/nonexistent/python")
    reason = bench.run_vllm([{"prompt_token_ids": [1, 2], "max_tokens": 4}], {"s": {"type": "object"}}, 1, "/tmp")
    assert isinstance(reason, str) and "not installed" in reason and "pip install" in reason
