"""The worker boundary: a StepInput is taken from the SchedulerOutput without copies, survives pickle
(what a worker in another process would receive) and gives the same logits on the other side; the
in-process worker implements the Worker interface and reports what it holds."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from pagedcore import LLM, SamplingParams
from pagedcore.engine.step_input import StepInput
from pagedcore.engine.worker import InProcessWorker, Worker

from .conftest import prompts_with_shared_prefix

ARRAYS = ("input_ids", "positions", "slot_mapping", "block_tables", "seq_lens", "query_start_loc",
          "blocks_to_swap_out", "blocks_to_swap_in", "blocks_to_copy")


@pytest.fixture(scope="module")
def engine(tiny_llama):
    _, folder = tiny_llama
    return LLM(folder, max_model_len=128, block_size=16, num_gpu_blocks_override=32).llm_engine


@pytest.fixture()
def scheduled(engine):
    """A real schedule of two prompts (one asks for prompt logprobs); cancelled afterwards."""
    for i, prompt in enumerate(prompts_with_shared_prefix(2, seed=5)):
        engine.add_request(f"r{i}", prompt_token_ids=prompt,
                           params=SamplingParams(max_tokens=4, prompt_logprobs=1 if i else None))
    out = engine.scheduler.schedule()
    yield out
    engine.scheduler.cancel_step()
    for i in range(2):
        engine.abort_request(f"r{i}")


def test_step_input_is_a_view_of_the_schedule(scheduled):
    out = scheduled
    step = StepInput.from_scheduler_output(out)
    for name in ARRAYS:
        mine, theirs = getattr(step, name), getattr(out, name)
        assert mine.dtype == theirs.dtype and mine.shape == theirs.shape, name
        if theirs.size:
            assert np.shares_memory(mine, theirs), f"{name} was copied"
    assert np.shares_memory(step.logits_indices, out.logits_indices)
    assert (step.num_tokens, step.max_query_len, step.max_seq_len) == (out.num_tokens, out.max_query_len, out.max_seq_len)
    extra = np.array([0, 1, 2], dtype=np.int64)
    with_extra = StepInput.from_scheduler_output(out, extra)
    assert with_extra.logits_indices.tolist() == out.logits_indices.tolist() + [0, 1, 2]


def test_step_input_round_trips_through_pickle(engine, scheduled):
    step = StepInput.from_scheduler_output(scheduled, engine.output_processor.prompt_logprob_rows(scheduled))
    assert len(step.logits_indices) > len(scheduled.logits_indices)       # prompt-logprob rows ride along
    copy = pickle.loads(pickle.dumps(step))
    for name in ARRAYS + ("logits_indices",):
        a, b = getattr(step, name), getattr(copy, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
        assert not b.size or not np.shares_memory(a, b)
    assert (copy.num_tokens, copy.max_query_len, copy.max_seq_len) == (step.num_tokens, step.max_query_len,
                                                                       step.max_seq_len)
    # The same step again (it rewrites the same KV slots with the same values): identical logits.
    here = engine.worker.execute_step(step)
    there = engine.worker.execute_step(copy)
    assert here.shape == (len(step.logits_indices), engine.model_config.vocab_size)
    assert torch.equal(here, there)


def test_in_process_worker_is_a_worker(engine):
    worker = engine.worker
    assert isinstance(worker, InProcessWorker) and isinstance(worker, Worker)
    report = worker.memory_report()
    spec = engine.kv_cache_spec
    assert report.kv_cache_bytes == 32 * spec.bytes_per_block == engine.view.kv_cache_bytes
    assert report.swap_bytes == 0
    assert report.weight_bytes >= 4 * engine.view.num_parameters       # fp32
    with pytest.raises(ValueError, match="CUDA"):
        worker.profile_memory(spec, None)


def test_worker_is_abstract():
    with pytest.raises(TypeError):
        Worker()


def test_gpu_budget_is_utilization_minus_the_profiled_peak():
    """The GPU sizing's arithmetic, apart from the profile the worker measures."""
    from pagedcore.config import EngineConfig
    from pagedcore.engine import kv_cache as kvc

    config = EngineConfig(gpu_memory_utilization=0.5, max_num_batched_tokens=300, max_model_len=128,
                          max_num_seqs=4)
    shape = kvc.ProfileShape.largest_step(config)
    assert (shape.num_tokens, shape.num_seqs, shape.seq_len, shape.num_logits_rows) == (300, 3, 128, 4)
    assert shape.num_blocks(16) == 3 * 8
    assert kvc.gpu_kv_cache_budget(config, total_bytes=1000, peak_bytes=200, shape=shape) == 300
    with pytest.raises(ValueError, match="gpu-memory-utilization"):
        kvc.gpu_kv_cache_budget(config, total_bytes=1000, peak_bytes=600, shape=shape)
