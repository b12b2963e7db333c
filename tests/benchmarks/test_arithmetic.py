"""Percentiles, the step breakdown and the roofline arithmetic, checked against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pagedcore.benchmarks import roofline, stats
from pagedcore.benchmarks.throughput import step_size_split
from pagedcore.benchmarks.serve import arrival_offsets, iter_sse_data
from pagedcore.benchmarks.workloads import BenchRequest

SMOLLM2 = roofline.ModelCost(hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                             num_kv_heads=3, head_dim=64, vocab_size=49152, tie_word_embeddings=True)


@pytest.mark.parametrize("values", [[3.0], [1.0, 2.0], [5, 1, 4, 2, 3], list(np.random.default_rng(0).random(101))])
def test_percentile_matches_numpy(values):
    for q in (0, 50, 90, 99, 100):
        assert stats.percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_distribution_of_nothing_is_nan():
    d = stats.distribution([])
    assert d["count"] == 0 and math.isnan(d["p50"]) and math.isnan(d["mean"])
    d = stats.distribution([0.001, 0.003], scale=1000)
    assert d["mean"] == pytest.approx(2.0) and d["p50"] == pytest.approx(2.0) and d["max"] == pytest.approx(3.0)


def test_breakdown_shares_of_wall():
    recs = [{"total": 1.0, "schedule": 0.1, "input_prep": 0.1, "model_forward": 0.6, "lm_head": 0.1,
             "sample": 0.05, "update_and_outputs": 0.05}] * 2
    b = stats.breakdown(recs, wall=2.5)
    assert b["num_steps"] == 2 and b["step_seconds"] == pytest.approx(2.0)
    assert b["seconds"]["between_steps"] == pytest.approx(0.5)
    assert b["share"]["model_forward"] == pytest.approx(1.2 / 2.5)
    assert b["outside_forward_share"] == pytest.approx(1 - 1.4 / 2.5)
    assert "scheduler" in stats.format_breakdown(b)


def test_step_size_split_groups_steps_by_tokens():
    def rec(tokens, forward):
        return {"num_tokens": tokens, "total": forward + 0.5, "model_forward": forward, "lm_head": 0.25}
    rows = step_size_split([rec(1, 1.0), rec(8, 1.0), rec(9, 2.0), rec(128, 1.0), rec(2048, 4.0)], 1e9)
    assert [r["label"] for r in rows] == ["<= 8", "9-64", "65-128", "> 512"]  # empty classes left out
    assert [r["steps"] for r in rows] == [2, 1, 1, 1] and [r["tokens"] for r in rows] == [9, 9, 128, 2048]
    assert rows[0]["seconds"] == pytest.approx(3.0) and rows[0]["lm_head_seconds"] == pytest.approx(0.5)
    assert rows[0]["layer_gflops"] == pytest.approx(9 / 2.0)          # 9 tokens x 1 GFLOP over 2 s
    assert rows[3]["layer_gflops"] == pytest.approx(2048 / 4.0)


def test_smollm2_costs_match_the_peer_readme():
    # shared/bench/README.md: ~269 MFLOP per token (lm_head 57 of them), ~538 MB of fp32 weights.
    assert SMOLLM2.linear_flops_per_token == 212_336_640
    assert SMOLLM2.lm_head_flops_per_row == 56_623_104
    assert SMOLLM2.num_params() == 134_515_008
    assert SMOLLM2.decode_weight_bytes(4) == 538_060_032
    assert roofline.decode_floor_tok_s(SMOLLM2, 4, 42.0) == pytest.approx(78.06, abs=0.01)
    assert roofline.decode_floor_tok_s(SMOLLM2, 2, 42.0) == pytest.approx(156.1, abs=0.1)


def test_workload_flops_by_hand():
    cost = roofline.ModelCost(hidden_size=4, intermediate_size=8, num_layers=2, num_heads=2, num_kv_heads=1,
                              head_dim=2, vocab_size=10)
    # per layer: qkv 4*(4+2*2)=32, o 4*4=16, gate_up 4*16=64, down 8*4=32 -> 144 params; x2 FLOPs x2 layers
    assert cost.linear_flops_per_token == 576
    reqs = [BenchRequest([1, 2, 3], 2)]              # 3 + 2 - 1 = 4 tokens through the layers, 2 sampled
    f = roofline.workload_flops(cost, reqs)
    assert f["tokens_through_layers"] == 4 and f["sampled_rows"] == 2
    assert f["linear"] == 4 * 576 and f["lm_head"] == 2 * 2 * 4 * 10
    assert f["attention"] == 4 * 2 * 4 * (1 + 2 + 3 + 4)   # 4 L q sum(context)
    floor = roofline.throughput_floor(cost, reqs, gemm_gflops=1e-9)   # 1 FLOP/s: floor = FLOPs
    assert floor["floor_seconds"] == pytest.approx(f["total"])
    assert roofline.gap(10.0, 4.0) == 2.5


def test_decode_step_floor_is_the_slower_bound():
    bw_bound = roofline.decode_step_floor_seconds(SMOLLM2, 4, 42.0, 147.0, batch=1)
    assert bw_bound == pytest.approx(538_060_032 / 42e9)
    compute_bound = roofline.decode_step_floor_seconds(SMOLLM2, 4, 42.0, 147.0, batch=64)
    assert compute_bound == pytest.approx(64 * (212_336_640 + 56_623_104) / 147e9)


def test_poisson_arrivals_and_sse_parsing():
    offsets = arrival_offsets(2000, rate=4.0, seed=0)
    assert offsets[0] == 0 and np.all(np.diff(offsets) >= 0)
    assert 2000 / offsets[-1] == pytest.approx(4.0, rel=0.1)
    assert not arrival_offsets(5, math.inf, 0).any()
    lines = ['data: {"choices": [{"text": "a"}]}', "", ": keep-alive", 'data: {"usage": {"completion_tokens": 1}}',
             "data: [DONE]", 'data: {"never": 1}']
    assert list(iter_sse_data(lines)) == [{"choices": [{"text": "a"}]}, {"usage": {"completion_tokens": 1}}]
