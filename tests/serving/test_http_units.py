"""Model-free checks of the serving pieces: the async engine's bookkeeping on a fake engine (queue
bound, aborts, drain, folding deltas), metrics from fake outputs, request parsing, API keys."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from pagedcore.outputs import CompletionOutput, RequestMetrics, RequestOutput
from pagedcore.sampling_params import SamplingParams
from pagedcore.serving.async_engine import AsyncLLMEngine, EngineDrainingError, QueueFullError
from pagedcore.serving.auth import parse_api_keys
from pagedcore.serving.metrics import ServerMetrics
from pagedcore.serving.openai.body import describe
from pagedcore.serving.openai.chat_template import load_chat_template
from pagedcore.serving.openai.errors import from_value_error
from pagedcore.serving.openai.protocol import ChatCompletionRequest, CompletionRequest


class FakeEngine:
    """LLMEngine's surface for the async engine: one token "t<i> " per running request per step."""

    def __init__(self, max_num_seqs: int = 2, step_seconds: float = 0.01):
        self.requests: dict[str, SimpleNamespace] = {}
        self.max_num_seqs = max_num_seqs
        self.step_seconds = step_seconds
        self.last_step_timing = None
        self.aborted: list[str] = []
        self.view = SimpleNamespace(scheduler_stats=self._stats, request_ids=lambda: list(self.requests))

    def _stats(self):
        n = len(self.requests)
        running = min(n, self.max_num_seqs)
        return SimpleNamespace(num_running=running, num_waiting=n - running, num_swapped=0,
                               kv_cache_usage=running / 10, prefix_query_tokens=0, prefix_hit_tokens=0,
                               num_preemptions=0, num_steps=0)

    def add_request(self, request_id, prompt=None, params=None, prompt_token_ids=None, arrival_time=None,
                    priority=0, output_kind="cumulative"):
        assert output_kind == "delta"
        if prompt == "refuse":
            raise ValueError("this prompt is refused")
        self.requests[request_id] = SimpleNamespace(params=params, tokens=[], prompt_ids=prompt_token_ids or [1, 2],
                                                    metrics=RequestMetrics(arrival_time=arrival_time))

    def has_unfinished_requests(self):
        return bool(self.requests)

    def _output(self, request_id, req, new_tokens, finish):
        text = "".join(f"t{t} " for t in new_tokens)
        return RequestOutput(request_id, None, req.prompt_ids, None,
                             [CompletionOutput(0, text, list(new_tokens), finish_reason=finish)],
                             finish is not None, req.metrics)

    def step(self):
        time.sleep(self.step_seconds)
        outputs, now = [], time.time()
        for request_id in list(self.requests)[:self.max_num_seqs]:
            req = self.requests[request_id]
            req.metrics.on_scheduled(now)
            req.tokens.append(len(req.tokens))
            req.metrics.on_tokens(now)
            finish = "length" if len(req.tokens) >= req.params.max_tokens else None
            if finish:
                del self.requests[request_id]
                req.metrics.on_finished(now)
            outputs.append(self._output(request_id, req, [req.tokens[-1]], finish))
        self.last_step_timing = {"num_tokens": len(outputs)}
        return outputs

    def abort_request(self, request_id):
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        self.aborted.append(request_id)
        req.metrics.on_finished(time.time())
        return self._output(request_id, req, [], "abort")


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_stream_and_final_outputs():
    async def main():
        engine = AsyncLLMEngine(FakeEngine())
        deltas = [o async for o in engine.generate("p", SamplingParams(max_tokens=3), "a")]
        finals = [o async for o in engine.generate("p", SamplingParams(max_tokens=3), "b", stream=False)]
        await engine.shutdown(1)
        return deltas, finals
    deltas, finals = run(main())
    assert [o.outputs[0].text for o in deltas] == ["t0 ", "t1 ", "t2 "] and deltas[-1].finished
    assert len(finals) == 1 and finals[0].outputs[0].text == "t0 t1 t2 " and finals[0].outputs[0].token_ids == [0, 1, 2]


def test_closing_a_stream_aborts_its_request():
    async def main():
        fake = FakeEngine()
        engine = AsyncLLMEngine(fake)
        async with engine.add_request("p", SamplingParams(max_tokens=1000), "a") as outputs:
            await outputs.__anext__()
        for _ in range(100):
            if "a" in fake.aborted:
                break
            await asyncio.sleep(0.01)
        n = engine.num_in_flight()
        await engine.shutdown(1)
        return fake, n
    fake, in_flight = run(main())
    assert fake.aborted == ["a"] and in_flight == 0


def test_queue_bound_refuses_at_once_and_drain_refuses_new_work():
    async def main():
        engine = AsyncLLMEngine(FakeEngine(max_num_seqs=1, step_seconds=0.05), max_queued_requests=1)
        first = engine.add_request("p", SamplingParams(max_tokens=50), "a")
        await first.__anext__()                                               # running: the only sequence
        second = engine.add_request("p", SamplingParams(max_tokens=1), "b")   # the one waiting place
        with pytest.raises(QueueFullError, match="--max-queued-requests"):
            engine.add_request("p", SamplingParams(max_tokens=1), "c")
        engine.stop_accepting()
        with pytest.raises(EngineDrainingError):
            engine.add_request("p", SamplingParams(max_tokens=1), "d")
        await first.aclose()
        await second.aclose()
        await engine.shutdown(1)
    run(main())


def test_shutdown_aborts_what_outlives_the_timeout_and_ends_its_stream():
    async def main():
        engine = AsyncLLMEngine(FakeEngine(step_seconds=0.02))
        outputs = engine.add_request("p", SamplingParams(max_tokens=10_000), "a", stream=False)
        shutdown = asyncio.ensure_future(engine.shutdown(0.2))
        final = await outputs.__anext__()
        await shutdown
        return final
    final = run(main())
    assert final.finished and final.outputs[0].finish_reason == "abort" and final.outputs[0].text.startswith("t0 ")


def test_a_refused_request_fails_alone():
    async def main():
        engine = AsyncLLMEngine(FakeEngine())
        with pytest.raises(ValueError, match="refused"):
            async for _ in engine.generate("refuse", SamplingParams(max_tokens=2)):
                pass
        ok = [o async for o in engine.generate("p", SamplingParams(max_tokens=2), stream=False)]
        await engine.shutdown(1)
        return ok
    assert run(main())[0].outputs[0].text == "t0 t1 "


def test_metrics_follow_the_kv_cache_commit():
    import torch

    from pagedcore.engine import host_memory

    metrics = ServerMetrics("m", lambda: None, max_model_len=128)

    def gauges():
        text = metrics.render().decode()
        return [next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                     if line.startswith(f'pagedcore:{name}{{model_name="m"}}'))
                for name in ("kv_cache_committed_bytes", "kv_cache_commit_target_bytes")]
    host_memory.commit_pages(torch.empty(2**20, dtype=torch.uint8))         # at least one commit to report
    committed, target = gauges()
    assert (committed, target) == host_memory.commit_totals()
    buffer = torch.empty(8 * 2**20, dtype=torch.uint8)
    commit = host_memory.commit_in_background(buffer, "metrics test")
    if commit is None:
        pytest.skip("no MADV_POPULATE_WRITE: commits run in the foreground")
    assert commit.wait(60)
    assert gauges() == [committed + commit.num_bytes, target + commit.num_bytes]


def test_metrics_from_a_step_hook():
    async def main():
        fake = FakeEngine()
        engine = AsyncLLMEngine(fake)
        metrics = ServerMetrics("m", lambda: engine.snapshot, max_model_len=128)
        engine.step_hooks.append(metrics.on_step)
        [o async for o in engine.generate("p", SamplingParams(max_tokens=3), "a", stream=False)]
        async with engine.add_request("p", SamplingParams(max_tokens=1000), "b") as outputs:
            await outputs.__anext__()
        for _ in range(100):
            if "b" in fake.aborted:
                break
            await asyncio.sleep(0.01)
        await engine.shutdown(1)
        return metrics.render().decode()
    text = run(main())

    def value(line_start):
        return next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start))
    assert value('pagedcore:prompt_tokens_total{model_name="m"}') == 4
    assert value('pagedcore:request_success_total{finished_reason="length",model_name="m"}') == 1
    assert value('pagedcore:request_success_total{finished_reason="abort",model_name="m"}') == 1
    assert value('pagedcore:time_to_first_token_seconds_count{model_name="m"}') == 2
    assert value('pagedcore:inter_token_latency_seconds_count{model_name="m"}') >= 2
    assert value('pagedcore:e2e_request_latency_seconds_count{model_name="m"}') == 2
    assert value('pagedcore:num_requests_running{model_name="m"}') == 0
    assert "_created" not in text


@pytest.mark.parametrize("body,message,param", [
    ('{"prompt": 5}', "prompt must be a string, a list of strings", "prompt"),
    ('{"prompt": "x", "n": "2"}', "n: Input should be a valid integer", "n"),
    ('{"prompt": "x", "stop": {"a": 1}}', "stop must be a string or a list of strings, got an object", "stop"),
    ('{"prompt": ', "not valid JSON", None),
    ('[]', "must be a JSON object", None),
    ('{}', "prompt is required", "prompt"),
])
def test_parse_errors_name_the_field(body, message, param):
    with pytest.raises(ValidationError) as raised:
        CompletionRequest.model_validate_json(body)
    text, where = describe(raised.value)
    assert message in text and where == param


def test_chat_content_errors_point_inside_the_list():
    with pytest.raises(ValidationError) as raised:
        ChatCompletionRequest.model_validate_json('{"messages": [{"role": "user", "content": [{"text": "x"}]}]}')
    assert describe(raised.value) == ("messages.0.content.0.type is required", "messages.0.content.0.type")


def test_sampling_params_errors_speak_json_and_the_request_field():
    with pytest.raises(ValueError) as raised:
        SamplingParams(logprobs=-1)
    error = from_value_error(raised.value, {"logprobs": "top_logprobs"})
    assert error.param == "top_logprobs" and error.message.startswith("top_logprobs must be null")


def test_api_keys_from_flags_commas_and_environment():
    assert parse_api_keys(["a,b", " c "], environ={"PAGEDCORE_API_KEY": "d,e"}) == ["a", "b", "c", "d", "e"]
    assert parse_api_keys(None, environ={}) == []


def test_chat_template_from_a_file_or_inline(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert load_chat_template(str(path)) == path.read_text()
    assert load_chat_template("{{ messages[0].content }}") == "{{ messages[0].content }}"
    assert load_chat_template(None) is None
    with pytest.raises(ValueError, match="neither a file nor a Jinja template"):
        load_chat_template("no-such-file.jinja")
