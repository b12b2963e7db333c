"""DPAsyncLLMEngine in process: concurrent requests spread over the two replicas and give one process's
greedy tokens; the router's loads and the ids in flight return to zero; snapshots and step hooks cover
both replicas; a replica whose rank dies stops the whole engine (on_dead once, health down, new
requests refused) as a dead single engine does."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from pagedcore import LLM
from pagedcore.config import EngineConfig
from pagedcore.distributed.dp_engine import DPAsyncLLMEngine
from pagedcore.distributed.dp_replicas import load_replicas
from pagedcore.distributed.errors import WorkerDiedError
from pagedcore.serving.async_engine import EngineDeadError, EngineDrainingError
from tests.models import tiny_models

from .engine_helpers import TINY_KIND, greedy, wait_gone

OPTIONS = dict(dtype="float32", max_model_len=256, block_size=16, num_gpu_blocks_override=64)
PROMPTS = [list(range(3 + 4 * i, 35 + 7 * i)) for i in range(4)]
NUM_TOKENS = 12


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return str(tiny_models.save_hf_folder(tiny_models.build_hf_model(TINY_KIND), tmp_path_factory.mktemp("dp_async")))


@pytest.fixture(scope="module")
def references(tiny_folder):
    with LLM(tiny_folder, **OPTIONS) as llm:
        outputs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=greedy(NUM_TOKENS), use_tqdm=False)
    return [o.outputs[0].token_ids for o in outputs]


@pytest.fixture(scope="module")
def engines(tiny_folder):
    engines = load_replicas(EngineConfig(model=tiny_folder, data_parallel_size=2, **OPTIONS))
    pids = [pid for e in engines for pid in e.worker.pids]
    yield engines
    for engine in engines:       # even when a test failed: no rank outlives the module
        engine.shutdown()
    assert wait_gone(pids)


async def _collect(dp, prompt, request_id):
    final = None
    async for output in dp.generate(None, greedy(NUM_TOKENS), request_id, prompt_token_ids=prompt, stream=False):
        final = output
    return final


def test_concurrent_requests_spread_and_equal_one_process(engines, references):
    async def run():
        dp = DPAsyncLLMEngine(engines)
        seen = []
        dp.step_hooks.append(lambda outputs, timing: seen.extend(o.request_id for o in outputs))
        try:
            outputs = await asyncio.gather(*(_collect(dp, p, f"r{i}") for i, p in enumerate(PROMPTS)))
            snapshot = dp.snapshot
            assert dp.num_in_flight() == 0 and not dp._owner
            assert all(load.num_requests == 0 for load in dp.router.loads)
            return outputs, snapshot, [r.snapshot.num_steps for r in dp.replicas], set(seen)
        finally:
            await dp.shutdown(5)

    outputs, snapshot, steps, seen = asyncio.run(run())
    assert [o.outputs[0].token_ids for o in outputs] == references
    assert all(n > 0 for n in steps) and snapshot.num_steps == sum(steps)   # both replicas ran, summed
    assert seen == {f"r{i}" for i in range(len(PROMPTS))}                   # hooks saw both replicas' outputs


def test_a_request_id_in_flight_is_refused_and_aborts_reach_its_replica(engines):
    async def run():
        dp = DPAsyncLLMEngine(engines)
        try:
            stream = dp.add_request(None, greedy(200), "same", prompt_token_ids=PROMPTS[0])
            with pytest.raises(ValueError, match="already in flight"):
                dp.add_request(None, greedy(2), "same", prompt_token_ids=PROMPTS[1])
            await dp.abort("same")
            outputs = [o async for o in stream]
            assert outputs[-1].finished and outputs[-1].outputs[0].finish_reason == "abort"
            assert not dp._owner and all(load.num_requests == 0 for load in dp.router.loads)
        finally:
            await dp.shutdown(5)

    asyncio.run(run())


def test_a_dead_replica_stops_the_whole_engine(engines):
    """Last in the module: the replicas are unusable afterwards."""
    async def run():
        dp = DPAsyncLLMEngine(engines)
        died = []
        dp.on_dead = died.append
        try:
            assert dp.accepting
            os.kill(engines[1].worker.pids[0], signal.SIGKILL)    # replica 1's only rank, while idle
            deadline = time.monotonic() + 30
            while dp.accepting and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert not dp.accepting
            assert len(died) == 1 and isinstance(died[0], WorkerDiedError) and "worker rank 0" in str(died[0])
            assert isinstance(dp.error, WorkerDiedError)
            with pytest.raises((EngineDeadError, EngineDrainingError)):
                dp.add_request(None, greedy(2), "late", prompt_token_ids=PROMPTS[0])
        finally:
            await dp.shutdown(5)

    asyncio.run(run())
