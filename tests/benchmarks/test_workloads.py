"""Workload generators and the token-id file format: lengths, determinism, shared prefixes."""

from __future__ import annotations

import os

import pytest

from pagedcore.benchmarks import workloads

# The fixed workload of shared/bench, vendored so that the check runs in every clone.
SHARED_WORKLOAD = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "workloads",
                               "workload_n128_seed0.json")


def test_synthetic_lengths_are_in_range_and_seeded():
    a = workloads.synthetic(200, vocab_size=1000, seed=3)
    b = workloads.synthetic(200, vocab_size=1000, seed=3)
    c = workloads.synthetic(200, vocab_size=1000, seed=4)
    assert [r.prompt_token_ids for r in a] == [r.prompt_token_ids for r in b]
    assert [r.max_tokens for r in a] == [r.max_tokens for r in b]
    assert [r.prompt_token_ids for r in a] != [r.prompt_token_ids for r in c]
    assert all(16 <= r.prompt_len <= 512 and 16 <= r.max_tokens <= 256 and r.ignore_eos for r in a)
    assert all(workloads.FIRST_PLAIN_TOKEN <= t < 1000 for r in a for t in r.prompt_token_ids)
    # The law's medians (140 / 93) are recovered roughly from 200 draws.
    s = workloads.summarize(a)
    assert 100 < s["prompt_len_median"] < 190 and 70 < s["output_len_median"] < 120


def test_synthetic_length_overrides():
    reqs = workloads.make_workload("synthetic", 500, 50, seed=0, min_prompt=8, max_prompt=20,
                                   min_output=2, max_output=4)
    assert len(reqs) == 50
    assert all(8 <= r.prompt_len <= 20 and 2 <= r.max_tokens <= 4 for r in reqs)


def test_shared_prefix_requests_share_their_first_tokens():
    reqs = workloads.shared_prefix(10, vocab_size=1000, seed=0, prefix_len=64)
    prefix = reqs[0].prompt_token_ids[:64]
    assert all(r.prompt_token_ids[:64] == prefix for r in reqs)
    assert len({tuple(r.prompt_token_ids[64:]) for r in reqs}) == 10     # unique suffixes
    assert all(16 <= r.prompt_len - 64 <= 128 for r in reqs)


def test_long_prompt_lengths():
    reqs = workloads.make_workload("long-prompt", 1000, 3, prompt_len=3000, output_len=7)
    assert [(r.prompt_len, r.max_tokens) for r in reqs] == [(3000, 7)] * 3


def test_file_round_trip_and_errors(tmp_path):
    reqs = workloads.synthetic(5, vocab_size=300, seed=1)
    path = str(tmp_path / "w.json")
    workloads.to_file(reqs, path, meta={"seed": 1})
    back = workloads.make_workload("file", 300, path=path)
    assert [(r.prompt_token_ids, r.max_tokens) for r in back] == [(r.prompt_token_ids, r.max_tokens) for r in reqs]
    assert len(workloads.from_file(path, num_requests=2)) == 2
    bad = tmp_path / "bad.json"
    bad.write_text('{"requests": [{"prompt": "hi"}]}')
    with pytest.raises(ValueError, match="prompt_token_ids"):
        workloads.from_file(str(bad))
    with pytest.raises(ValueError, match="--workload-file"):
        workloads.make_workload("file", 300)
    with pytest.raises(ValueError, match="choose one of"):
        workloads.make_workload("nope", 300)


def test_the_shared_workload_reads_as_documented():
    s = workloads.summarize(workloads.from_file(SHARED_WORKLOAD))
    assert (s["num_requests"], s["prompt_tokens"], s["output_tokens"]) == (128, 24618, 12713)
