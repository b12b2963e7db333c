"""The model-free simulation: invariants of every run, and the directions its comparisons must take."""

import argparse
import dataclasses
import json

import numpy as np
import pytest

from pagedcore.simulator.cli import add_simulate_parser
from pagedcore.simulator.cost_model import DEFAULT_COST_MODEL, CostModel, fit_cost_model, fit_from_trace
from pagedcore.simulator.simulation import DEFAULT_POLICIES, SimConfig, policy_config, simulate
from pagedcore.simulator.workload import WorkloadSpec, make_workload

# A cost model with a large fixed cost per step, as decode on real hardware has (weights read once per step).
COST = CostModel(a=0.02, b=2e-5, c=1e-7, d=1e-4, e=5e-5)
MIXED = WorkloadSpec(num_requests=400, min_prompt_len=16, max_prompt_len=256, min_output_len=4,
                     max_output_len=256, shared_prefix_len=128, num_prefix_groups=2, seed=1)


def run(policy, spec=MIXED, cost=COST, **config):
    base = SimConfig(**{"num_gpu_blocks": 1024, "max_num_seqs": 64, "max_model_len": spec.max_request_len, **config})
    return simulate(make_workload(spec), policy_config(base, policy), cost, policy=policy).metrics


@pytest.mark.parametrize("policy", DEFAULT_POLICIES)
def test_every_policy_finishes_every_request_with_sane_figures(policy):
    m = run(policy)
    requests = make_workload(MIXED)
    assert m["num_requests"] == len(requests) and m["num_rejected"] == 0
    assert m["num_sampled_tokens"] == sum(r.max_tokens for r in requests)
    assert m["num_decode_tokens"] + m["num_requests"] <= m["num_sampled_tokens"]   # the rest end a prefill chunk
    num_prompt = sum(len(r.prompt_token_ids) for r in requests)
    assert m["num_prefill_tokens"] >= num_prompt * (1 - m["prefix_hit_rate"]) - 1
    for k in ("batch_occupancy", "kv_usage", "kv_waste", "kv_waste_contiguous", "busy_fraction", "token_budget_use"):
        assert 0 <= m[k] <= 1, (k, m[k])
    assert m["ttft_ms"]["p50"] <= m["e2e_ms"]["p50"] and m["ttft_ms"]["p50"] <= m["ttft_ms"]["p99"]
    assert m["throughput_tokens_per_s"] > 0


def test_continuous_batching_beats_static_on_a_mixed_length_workload():
    cont, static = run("continuous"), run("static")
    assert cont["throughput_tokens_per_s"] > 1.3 * static["throughput_tokens_per_s"]
    assert cont["batch_occupancy"] > static["batch_occupancy"]
    assert static["padded_rows_fraction"] > 0 and cont["padded_rows_fraction"] == 0
    assert cont["ttft_ms"]["p50"] < static["ttft_ms"]["p50"]


def test_continuous_beats_static_with_the_calibrated_default_cost_model():
    assert run("continuous", cost=DEFAULT_COST_MODEL)["throughput_tokens_per_s"] > \
        run("static", cost=DEFAULT_COST_MODEL)["throughput_tokens_per_s"]


def test_prefix_caching_reduces_prefill_tokens():
    on, off = run("continuous"), run("no-prefix-caching")
    assert on["prefix_hit_rate"] > 0.2 and off["prefix_hit_rate"] == 0
    assert on["num_prefill_tokens"] < 0.8 * off["num_prefill_tokens"]
    assert on["throughput_tokens_per_s"] > off["throughput_tokens_per_s"]


def test_swap_recomputes_nothing_that_recompute_recomputes():
    small = dict(num_gpu_blocks=160)            # too small a cache: preemptions happen
    recompute, swap = run("continuous", **small), run("swap", **small)
    assert recompute["num_preemptions"] > 0 and swap["num_preemptions"] > 0
    assert swap["num_prefill_tokens"] < recompute["num_prefill_tokens"]


def test_no_preemption_when_the_cache_holds_everything():
    assert run("continuous", num_gpu_blocks=20_000)["num_preemptions"] == 0


def test_smaller_blocks_waste_less_of_the_cache():
    w8, w16, w32 = (run(p)["kv_waste"] for p in ("block-size-8", "continuous", "block-size-32"))
    assert w8 < w16 < w32
    assert run("continuous")["kv_waste_contiguous"] > 5 * w16      # paging's point


def test_chunked_prefill_off_raises_the_budget_to_a_whole_prompt():
    cfg = policy_config(SimConfig(max_num_batched_tokens=256, max_model_len=1024), "no-chunked-prefill")
    assert cfg.scheduler_config().max_num_batched_tokens == 1024
    spec = dataclasses.replace(MIXED, num_requests=100)
    assert run("no-chunked-prefill", spec, max_num_batched_tokens=256)["num_requests"] == 100


def test_thousands_of_requests_all_finish():
    # Speed is a benchmark figure, not an assertion: `pagedcore simulate --num-requests 3000`
    # prints its own run time (about a second on an idle 2-core machine).
    spec = dataclasses.replace(MIXED, num_requests=3000)
    m = run("continuous", spec)
    assert m["num_requests"] == 3000


def test_fit_recovers_a_known_cost_model():
    rng = np.random.default_rng(0)
    rows = np.column_stack([rng.integers(1, 2048, 200), rng.integers(1, 100_000, 200), rng.integers(1, 256, 200)])
    truth = CostModel(a=0.01, b=3e-5, c=2e-8, d=2e-4)
    y = np.array([truth.step_time(*r) for r in rows]) * (1 + 0.01 * rng.standard_normal(200))
    fitted = fit_cost_model(rows, y)
    for k in "abcd":
        assert getattr(fitted, k) == pytest.approx(getattr(truth, k), rel=0.1)
    assert fitted.fit["r2"] > 0.99


def test_fit_drops_a_negative_coefficient():
    rows = np.column_stack([np.arange(1, 50), np.zeros(49), np.arange(1, 50)])   # tokens == seqs, no context
    fitted = fit_cost_model(rows, 0.01 + 1e-3 * np.arange(1, 50))
    assert min(fitted.a, fitted.b, fitted.c, fitted.d) >= 0
    assert fitted.step_time(10, 0, 10) == pytest.approx(0.02, rel=1e-6)


def test_a_simulated_trace_calibrates_back_to_its_own_cost_model(tmp_path):
    path = tmp_path / "sim.jsonl"
    parser = argparse.ArgumentParser()
    add_simulate_parser(parser.add_subparsers(dest="command"))
    model_file = tmp_path / "cost.json"
    model_file.write_text(COST.to_json())
    args = parser.parse_args(["simulate", "--num-requests", "200", "--policies", "continuous", "--cost-model",
                              str(model_file), "--trace-file", str(path), "--trace-steps", "400"])
    assert args.func(args) == 0
    fitted = fit_from_trace(str(path))
    for k in "abcd":
        assert getattr(fitted, k) == pytest.approx(getattr(COST, k), rel=1e-3, abs=1e-12)


def test_cli_prints_the_comparison_table(capsys):
    parser = argparse.ArgumentParser()
    add_simulate_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["simulate", "--num-requests", "100", "--policies", "continuous,static"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "continuous" in out and "static" in out and "TTFT p50/p99 ms" in out
    args = parser.parse_args(["simulate", "--num-requests", "50", "--policies", "continuous", "--json"])
    args.func(args)
    assert json.loads(capsys.readouterr().out)["results"][0]["metrics"]["num_requests"] == 50


def test_bad_settings_name_the_fix():
    with pytest.raises(ValueError, match="unknown policy 'dynamic'"):
        policy_config(SimConfig(), "dynamic")
    with pytest.raises(ValueError, match="min_prompt_len"):
        WorkloadSpec(min_prompt_len=10, max_prompt_len=5)
    with pytest.raises(ValueError, match="CostModel.a must be >= 0"):
        CostModel(a=-1)
