"""Faults, injected with the engine's test hook (engine/fault_injection.py, off by default):

- a step that raises fails the requests of that step, cleanly, and the engine goes on: requests
  that were waiting run afterwards, and every block is free again;
- an error that leaves the engine unusable (or three failed steps in a row) fails every request,
  running and waiting, with a clear error; /health turns 503 and the server exits non-zero;
- a step failing before a streaming request's first token is a clean HTTP error, not a 200;
- a client that vanishes while queued, in prefill or in decode frees its blocks.
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from pagedcore.engine.fault_injection import ENV_VAR, FaultInjector, InjectedFatalFault, InjectedStepFault
from pagedcore.sampling_params import SamplingParams
from pagedcore.serving.async_engine import AsyncLLMEngine, EngineDeadError, StepFailedError
from tests.serving.http_helpers import ServerProcess, metric, wait_until


def test_the_hook_is_off_unless_asked(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert FaultInjector.from_env() is None
    injector = FaultInjector("step:2,fatal:3")
    injector.on_step()
    with pytest.raises(InjectedStepFault):
        injector.on_step()
    with pytest.raises(InjectedFatalFault):
        injector.on_step()
    injector.on_step()     # each fault fires once
    with pytest.raises(ValueError, match="step:N or fatal:N"):
        FaultInjector("boom:1")


def test_the_delay_is_parsed_and_slows_every_step():
    # A delay set before the fields were initialised used to be reset to 0: the entry did nothing.
    assert FaultInjector("delay:40").delay_s == pytest.approx(0.04)
    assert FaultInjector("step:3,delay:25").delay_s == pytest.approx(0.025)
    injector = FaultInjector("delay:30")
    start = time.perf_counter()
    for _ in range(5):
        injector.on_step()
    assert time.perf_counter() - start >= 5 * 0.030   # a bound the hook guarantees, not a speed figure


# -- in process, on an engine that runs one sequence at a time (so others wait) ---------------------

@pytest.fixture(scope="module")
def engine():
    from pagedcore import LLM

    llm = LLM(kv_cache_memory="64MiB", max_model_len=256, max_num_seqs=1)
    return llm.llm_engine


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


async def _consume(stream) -> tuple[int, BaseException | None]:
    """(tokens received, the error that ended the stream or None)."""
    tokens = 0
    try:
        async with stream:
            async for out in stream:
                tokens += len(out.outputs[0].token_ids)
    except Exception as error:   # noqa: BLE001 - the test inspects it
        return tokens, error
    return tokens, None


def _assert_idle(engine) -> None:
    stats = engine.view.scheduler_stats()
    assert engine.view.num_unfinished_requests == 0
    assert stats.num_running == stats.num_waiting == 0 and stats.kv_cache_usage == 0.0, stats


def test_a_failed_step_fails_its_requests_and_the_engine_goes_on(engine):
    async def run():
        async_engine = AsyncLLMEngine(engine)
        try:
            engine.fault_injector = FaultInjector("step:3")   # the running request's 2nd decode step
            running = async_engine.add_request("Count:", greedy(8))
            waiting = async_engine.add_request("Hello", greedy(3))     # max_num_seqs 1: waits
            (got_running, error), (got_waiting, waiting_error) = await asyncio.gather(
                _consume(running), _consume(waiting))
            assert isinstance(error, StepFailedError) and "fault injected" in str(error)
            assert "the server goes on" in str(error) and got_running == 2
            assert waiting_error is None and got_waiting == 3           # not in the failed step: unharmed
            again = async_engine.add_request("Hello", greedy(2))        # and the engine goes on
            assert await _consume(again) == (2, None)
            assert async_engine.accepting and async_engine.error is None
        finally:
            engine.fault_injector = None
            await async_engine.shutdown(timeout=5)
        _assert_idle(engine)

    asyncio.run(run())


@pytest.mark.parametrize("spec", ["fatal:2", "step:2,step:3,step:4"])
def test_an_unusable_engine_fails_every_request_and_says_so(engine, spec):
    async def run():
        async_engine = AsyncLLMEngine(engine)
        deaths = []
        async_engine.on_dead = deaths.append
        engine.fault_injector = FaultInjector(spec)
        try:
            running = async_engine.add_request("Count:", greedy(8))
            waiting = [async_engine.add_request("Hello", greedy(3)) for _ in range(2)]
            results = await asyncio.gather(_consume(running), *(_consume(w) for w in waiting))
            # "step" faults fail the running request one at a time; the third in a row kills the engine.
            errors = [error for _, error in results]
            assert isinstance(errors[-1], EngineDeadError) and "retry against another replica" in str(errors[-1])
            assert all(isinstance(e, (EngineDeadError, StepFailedError)) for e in errors), errors
            assert len(deaths) == 1 and async_engine.error is deaths[0] and not async_engine.accepting
            with pytest.raises(EngineDeadError):
                async_engine.add_request("Hi", greedy(1))
        finally:
            engine.fault_injector = None
            await async_engine.shutdown(timeout=5)
        for request_id in engine.view.request_ids():   # a dead engine is not cleaned up; this test reuses it
            engine.abort_request(request_id)
        _assert_idle(engine)

    asyncio.run(run())


# -- over HTTP: the status codes and the process's exit ---------------------------------------------

def test_a_failed_prefill_is_a_clean_http_error_then_the_server_goes_on():
    # Step 1 is the streaming request's prefill: its response has not started, so it gets a real 500.
    server = ServerProcess("--max-num-seqs", "1", env={ENV_VAR: "step:1"})
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=300) as client:
            body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "stream": True}
            with client.stream("POST", "/v1/chat/completions", json=body) as response:
                assert response.status_code == 500
                error = httpx.Response(500, content=response.read()).json()["error"]
            assert "fault injected" in error["message"] and error["type"] == "server_error"
            ok = client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "stream": False})
            assert ok.status_code == 200, ok.text
            assert client.get("/health").status_code == 200
            assert wait_until(lambda: metric(server.url, "pagedcore:kv_cache_usage_perc") == 0.0)
    finally:
        assert server.stop() == 0


def test_a_fatal_fault_turns_health_503_and_exits_non_zero():
    server = ServerProcess(env={ENV_VAR: "fatal:2"})
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=300) as client:
            r = client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 4, "ignore_eos": True})
            assert r.status_code == 503, r.text
            assert "the engine stopped after an error" in r.json()["error"]["message"]
            health = client.get("/health")        # served for a moment before the exit, for probes
            assert health.status_code == 503 and health.json() == {"status": "failed"}
            late = client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1})
            assert late.status_code == 503
        assert server.proc.wait(timeout=60) == 1, server.log()
        assert "the engine is unusable" in server.log()
    finally:
        server.stop()


# -- a client that vanishes in every phase frees its blocks -----------------------------------------

@pytest.fixture(scope="module")
def slow_server():
    # One sequence at a time and 16-token prefill chunks: a long prompt takes many steps to prefill.
    # Each step also sleeps 100 ms, so that the prefill (~57 steps) outlasts the 0.5 s client timeout of
    # the prefill test on any CPU (a quiet machine runs a 16-token step in a few ms).
    server = ServerProcess("--max-num-seqs", "1", "--max-num-batched-tokens", "16", "--no-enable-prefix-caching",
                           env={"PAGEDCORE_FAULT_INJECTION": "delay:100"})
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


LONG_PROMPT = list(range(1000, 1000 + 900))     # 900 token ids: ~57 prefill steps of 16 tokens


def _idle(url: str) -> bool:
    return (metric(url, "pagedcore:kv_cache_usage_perc") == 0.0 and metric(url, "pagedcore:num_requests_running") == 0
            and metric(url, "pagedcore:num_requests_waiting") == 0)


def _request_in_thread(url: str, body: dict, cancel: threading.Event) -> threading.Thread:
    """Sends body as a stream and hangs up as soon as `cancel` is set (or on the first chunk)."""
    def run():
        with httpx.Client(timeout=300) as client:
            with client.stream("POST", url + "/v1/completions", json=body) as response:
                for _ in response.iter_lines():
                    if cancel.wait(0):
                        return
                    cancel.wait()
                    return
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_the_delay_applies_to_every_step_of_a_served_request(slow_server):
    # 900 prompt tokens in 16-token chunks: 57 prefill steps, then the decode steps; each sleeps 100 ms.
    start = time.perf_counter()
    r = httpx.post(slow_server.url + "/v1/completions", json={"prompt": LONG_PROMPT, "max_tokens": 2,
                                                             "ignore_eos": True}, timeout=300)
    assert r.status_code == 200, r.text
    assert time.perf_counter() - start >= (57 + 1) * 0.100
    assert wait_until(lambda: _idle(slow_server.url), timeout=60)


def test_vanishing_in_prefill_frees_the_blocks(slow_server):
    url = slow_server.url
    with httpx.Client(timeout=0.5) as client:
        with pytest.raises(httpx.ReadTimeout):   # hangs up after 0.5 s: mid-prefill (its response waits for a token)
            client.post(url + "/v1/completions", json={"prompt": LONG_PROMPT, "max_tokens": 4, "stream": True})
    assert metric(url, "pagedcore:num_requests_running") in (0, 1)
    assert wait_until(lambda: _idle(url), timeout=60)


def test_vanishing_in_decode_frees_the_blocks(slow_server):
    url = slow_server.url
    cancel = threading.Event()
    thread = _request_in_thread(url, {"prompt": "Count:", "max_tokens": 200, "ignore_eos": True, "stream": True},
                                cancel)
    assert wait_until(lambda: metric(url, "pagedcore:generation_tokens_total") > 2, timeout=120)
    cancel.set()
    thread.join(60)
    assert wait_until(lambda: _idle(url), timeout=60)


def test_vanishing_while_queued_frees_the_place(slow_server):
    url = slow_server.url
    hold = threading.Event()
    running = _request_in_thread(url, {"prompt": "Count:", "max_tokens": 400, "ignore_eos": True, "stream": True},
                                 hold)
    assert wait_until(lambda: metric(url, "pagedcore:num_requests_running") == 1, timeout=120)
    with httpx.Client(timeout=2) as client:
        with pytest.raises(httpx.ReadTimeout):   # queued behind the running one, then gone
            client.post(url + "/v1/completions", json={"prompt": LONG_PROMPT, "max_tokens": 4})
    assert wait_until(lambda: metric(url, "pagedcore:num_requests_waiting") == 0, timeout=60)
    assert metric(url, "pagedcore:num_requests_running") == 1          # the running one was not touched
    hold.set()
    running.join(60)
    assert wait_until(lambda: _idle(url), timeout=60)
