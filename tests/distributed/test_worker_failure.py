"""A model rank that dies or fails: the step raises WorkerDiedError naming it within a bounded time,
the other ranks stop, nothing hangs; a server answers 500 naming the cause, turns /health 503 and
exits non-zero; a driver that dies takes its ranks with it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import httpx
import numpy as np
import pytest

from pagedcore.config import EngineConfig
from pagedcore.distributed.errors import WorkerDiedError
from pagedcore.engine.llm_engine import LLMEngine
from pagedcore.engine.step_input import StepInput
from tests.models import tiny_models
from tests.serving.http_helpers import ServerProcess, metric, wait_until

from .engine_helpers import TINY_KIND, greedy, rank_pids, shm_segments, wait_gone

# Bounds that only a hang can exceed (the detection itself takes a poll period, ~0.1 s, plus up to
# 1 s to collect a failing rank's last words): they are timeouts, not speed figures.
DETECT_BOUND_S = 30
LAYOUTS = {"tp2": dict(tensor_parallel_size=2), "pp2": dict(pipeline_parallel_size=2)}


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    hf_model = tiny_models.build_hf_model(TINY_KIND)
    return tiny_models.save_hf_folder(hf_model, tmp_path_factory.mktemp("dist_failure_tiny"))


@pytest.fixture
def make_engine():
    engines = []

    def make(**kw):
        engine = LLMEngine(EngineConfig(**{"max_model_len": 256, "block_size": 16, "num_gpu_blocks_override": 64,
                                           **kw}))
        engines.append(engine)
        return engine

    yield make
    for engine in engines:   # even when the test failed: no rank outlives its test
        engine.shutdown()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_killed_rank_fails_the_step_naming_it(tiny_folder, make_engine, layout):
    engine = make_engine(model=tiny_folder, **LAYOUTS[layout])
    executor = engine.worker
    pids = executor.pids
    engine.add_request("a", prompt_token_ids=list(range(3, 40)), params=greedy(100))
    engine.step()
    os.kill(pids[1], signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerDiedError, match=rf"worker rank 1 \(pid {pids[1]}\) died: killed by signal 9 \(SIGKILL\)"):
        while engine.has_unfinished_requests():
            engine.step()
    assert time.monotonic() - start < DETECT_BOUND_S
    assert wait_gone(pids, DETECT_BOUND_S), "the surviving rank did not stop"
    with pytest.raises(WorkerDiedError, match="worker rank 1"):   # unusable from now on, at once
        engine.step()
    assert shm_segments(os.getpid()) == []   # the executor released its channels and group


def test_a_rank_that_raises_is_reported_with_its_error(tiny_folder, make_engine):
    engine = make_engine(model=tiny_folder, pipeline_parallel_size=2)
    pids = engine.worker.pids
    no_moves = np.zeros((0, 2), dtype=np.int32)
    bad = StepInput(input_ids=np.zeros(0, np.int64), positions=np.zeros(0, np.int64),
                    slot_mapping=np.zeros(0, np.int64), block_tables=np.zeros((0, 1), np.int32),
                    seq_lens=np.zeros(0, np.int32), query_start_loc=np.zeros(1, np.int32),
                    logits_indices=np.zeros(0, np.int64), blocks_to_swap_out=no_moves, blocks_to_swap_in=no_moves,
                    blocks_to_copy=np.array([[0, 10**6]], dtype=np.int32),   # a block the cache does not have
                    num_tokens=0, max_query_len=0, max_seq_len=0)
    with pytest.raises(WorkerDiedError, match=r"worker rank \d \(pid \d+\) failed during a step: \w+"):
        engine.worker.execute_step(bad)
    assert wait_gone(pids, DETECT_BOUND_S)


def test_shutdown_stops_every_rank_and_is_idempotent(tiny_folder, make_engine):
    engine = make_engine(model=tiny_folder, pipeline_parallel_size=2)
    pids = engine.worker.pids
    engine.shutdown()
    assert wait_gone(pids, DETECT_BOUND_S)
    assert shm_segments(os.getpid()) == []
    engine.shutdown()
    with pytest.raises(WorkerDiedError, match="shut down"):
        engine.check_health()


_DRIVER = textwrap.dedent("""
    import json, sys, time
    from pagedcore.engine.llm_engine import LLMEngine
    from pagedcore.config import EngineConfig

    if __name__ == "__main__":
        engine = LLMEngine(EngineConfig(model=sys.argv[1], max_model_len=256, block_size=16, num_gpu_blocks_override=32,
                                        {layout}))
        print(json.dumps(engine.worker.pids), flush=True)
        time.sleep(600)
""")


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_killed_driver_leaves_no_orphan_rank(tiny_folder, tmp_path, layout):
    script = tmp_path / "driver.py"
    script.write_text(_DRIVER.format(layout=", ".join(f"{k}={v}" for k, v in LAYOUTS[layout].items())))
    driver = subprocess.Popen([sys.executable, str(script), tiny_folder], stdout=subprocess.PIPE, text=True)
    try:
        line = driver.stdout.readline()
        assert line, f"the driver exited with {driver.wait()}"
        pids = json.loads(line)
        assert len(pids) == 2
        driver.kill()
        driver.wait()
        assert wait_gone(pids, DETECT_BOUND_S), "ranks outlived their driver"
        assert shm_segments(driver.pid) == [], "a killed driver's shared memory is left for the next run"
    finally:
        driver.kill()
        driver.wait()
        driver.stdout.close()


def test_a_killed_rank_under_serve_fails_the_request_with_500_and_the_server_exits_1():
    server = ServerProcess("--tensor-parallel-size", "2")
    try:
        server.wait_ready()
        ranks = rank_pids(server.proc.pid)
        assert len(ranks) == 2, server.log()
        replies = {}

        def long_request():
            with httpx.Client(base_url=server.url, timeout=300) as client:
                replies["completion"] = client.post("/v1/completions", json={
                    "prompt": "Once upon a time", "max_tokens": 900, "ignore_eos": True})

        thread = threading.Thread(target=long_request)
        thread.start()
        assert wait_until(lambda: metric(server.url, "pagedcore:num_requests_running") > 0, timeout=120)
        victim = ranks[1]
        os.kill(victim, signal.SIGKILL)
        thread.join(DETECT_BOUND_S)
        assert not thread.is_alive(), "the request in flight hung after a rank died"
        reply = replies["completion"]
        assert reply.status_code == 500, reply.text
        error = reply.json()["error"]   # an OpenAI error object naming the cause
        assert re.search(rf"worker rank \d \(pid {victim}\) died: killed by signal 9", error["message"]), error
        assert error["type"] and error["code"] == 500
        health = httpx.get(server.url + "/health", timeout=30)   # served for a moment before the exit
        assert health.status_code == 503
        assert server.proc.wait(timeout=60) == 1, server.log()
        assert wait_gone(ranks, DETECT_BOUND_S), "a rank outlived the server"
        assert shm_segments(server.proc.pid) == []
    finally:
        server.stop()


def test_a_rank_that_dies_while_the_server_is_idle_turns_health_503_and_exits_1():
    server = ServerProcess("--pipeline-parallel-size", "2")
    try:
        server.wait_ready()
        ranks = rank_pids(server.proc.pid)
        assert len(ranks) == 2, server.log()
        seen = []

        def health() -> int | None:
            try:
                seen.append(httpx.get(server.url + "/health", timeout=10).status_code)
            except httpx.TransportError:   # the server has exited
                seen.append(None)
            return seen[-1]

        assert health() == 200
        os.kill(ranks[0], signal.SIGKILL)
        assert wait_until(lambda: health() != 200, timeout=DETECT_BOUND_S), "no request, and still healthy"
        assert server.proc.wait(timeout=60) == 1, server.log()
        assert 503 in seen or seen[-1] is None
        assert re.search(rf"worker rank 0 \(pid {ranks[0]}\) died: killed by signal 9", server.log())
        assert wait_gone(ranks, DETECT_BOUND_S)
    finally:
        server.stop()
