"""Fuzzing: schemathesis against the server's own OpenAPI document (every route, bodies from the
request models, valid and invalid data), and hypothesis-built gRPC messages. Pass: no 5xx (no
INTERNAL / UNKNOWN), no call longer than CALL_TIMEOUT_S, and the server answers a valid request after
every case. Short here (FUZZ_EXAMPLES per route and mode); `PAGEDCORE_FUZZ_EXAMPLES=500` runs long.

Left out: GET /simulator/events (an endless SSE stream by design) and the simulator's POSTs that
launch work (/simulator/workload, /simulator/simulate), which belong to the simulator's tests."""

from __future__ import annotations

import os

import grpc
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedcore.serving.http_app import build_app
from pagedcore.serving.state import ServerState
from tests.serving.http_helpers import ServerProcess, free_port

schemathesis = pytest.importorskip("schemathesis")   # the test extra (pyproject) installs it

FUZZ_EXAMPLES = int(os.environ.get("PAGEDCORE_FUZZ_EXAMPLES", "12"))
CALL_TIMEOUT_S = 120.0     # a call slower than this is a hang (generation is bounded by the tiny max_model_len)
SKIPPED = {"GET /simulator/events", "POST /simulator/workload", "POST /simulator/simulate"}


def _cases() -> list[tuple[str, str]]:
    """(operation, generation mode) for every route; "negative" (invalid data) only where there is a
    body to make invalid (a free-form path parameter has no invalid value)."""
    schema = build_app(ServerState(served_model_names=["m"])).openapi()
    cases = []
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            label = f"{method.upper()} {path}"
            if label in SKIPPED:
                continue
            cases.append((label, "positive"))
            if op.get("requestBody"):
                cases.append((label, "negative"))
    return cases


@pytest.fixture(scope="module")
def server():
    grpc_port = free_port()
    # Small everything: a valid fuzzed request generates at most ~30 tokens, a few sequences at a time.
    s = ServerProcess("--max-model-len", "32", "--max-num-seqs", "4", "--max-logprobs", "5", "--grpc-port",
                      str(grpc_port))
    s.grpc_port = grpc_port
    try:
        s.wait_ready()
        yield s
    finally:
        assert s.stop() == 0


@pytest.fixture(scope="module")
def schema(server):
    return schemathesis.openapi.from_url(server.url + "/openapi.json")


def _still_serves(url: str) -> None:
    r = httpx.post(url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1, "temperature": 0}, timeout=60)
    assert r.status_code == 200, r.text


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("label,mode", _cases())
def test_http_route_survives_fuzzing(server, schema, label, mode):
    operation = schema.find_operation_by_label(label)
    assert operation is not None, f"{label} is not in the served OpenAPI document"
    strategy = operation.as_strategy(schemathesis.GenerationMode(mode))

    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def run(case):
        try:
            response = case.call(base_url=server.url, timeout=CALL_TIMEOUT_S)
        except Exception as error:   # a timeout is a hang; a reset connection is a crash
            raise AssertionError(f"{label} with {case.body!r:.300}: {type(error).__name__}: {error}") from None
        assert response.status_code < 500, f"{label} -> {response.status_code}: {response.text[:500]}"
        assert httpx.get(server.url + "/health", timeout=30).status_code == 200

    run()
    _still_serves(server.url)


# -- gRPC: hypothesis builds the messages ------------------------------------------------------------

def _messages():
    from pagedcore.serving.grpc.stubs import generation_pb2 as pb

    u32 = st.integers(min_value=0, max_value=2**32 - 1)
    small = st.one_of(st.integers(min_value=0, max_value=40), u32)
    floats = st.floats(allow_nan=True, allow_infinity=True, width=32)
    texts = st.text(max_size=60)
    sampling = st.builds(pb.SamplingParameters, temperature=floats, top_k=small, top_p=floats, typical_p=floats,
                         seed=st.integers(min_value=0, max_value=2**64 - 1))
    stopping = st.builds(pb.StoppingCriteria, max_new_tokens=small, min_new_tokens=small,
                         time_limit_millis=st.sampled_from([0, 1, 50, 2**32 - 1]),
                         stop_sequences=st.lists(texts, max_size=3), include_stop_sequence=st.booleans())
    response = st.builds(pb.ResponseOptions, input_text=st.booleans(), generated_tokens=st.booleans(),
                         input_tokens=st.booleans(), token_logprobs=st.booleans(), token_ranks=st.booleans(),
                         top_n_tokens=small)
    length_penalty = st.builds(pb.DecodingParameters.LengthPenalty, start_index=small, decay_factor=floats)
    guided = st.one_of(st.just({}), st.fixed_dictionaries({"regex": texts}),
                       st.fixed_dictionaries({"json_schema": st.sampled_from(['{"type": "integer"}', "{", "[]"])}),
                       st.fixed_dictionaries({"format": st.sampled_from([0, 1])}),
                       st.fixed_dictionaries({"grammar": texts}))
    decoding = st.builds(lambda penalty, lp, g: pb.DecodingParameters(repetition_penalty=penalty, length_penalty=lp,
                                                                      **g),
                         floats, st.one_of(st.none(), length_penalty), guided)
    params = st.builds(pb.Parameters, method=st.sampled_from([0, 1, 7]), sampling=sampling, stopping=stopping,
                       response=response, decoding=decoding, truncate_input_tokens=small)
    request = st.builds(pb.GenerationRequest, text=texts)
    names = st.sampled_from(["", "smol", "other"])
    maybe = st.one_of(st.none(), texts)
    batched = st.builds(lambda prefix, adapter, **kw: pb.BatchedGenerationRequest(
                            **kw, **({} if prefix is None else {"prefix_id": prefix}),
                            **({} if adapter is None else {"adapter_id": adapter})),
                        maybe, maybe, model_id=names, requests=st.lists(request, max_size=3), params=params)
    single = st.builds(pb.SingleGenerationRequest, model_id=names, request=request, params=params)
    tokenize = st.builds(pb.BatchedTokenizeRequest, model_id=names,
                         requests=st.lists(st.builds(pb.TokenizeRequest, text=texts), max_size=3),
                         return_tokens=st.booleans(), return_offsets=st.booleans(), truncate_input_tokens=small)
    return st.one_of(st.tuples(st.just("Generate"), batched), st.tuples(st.just("GenerateStream"), single),
                     st.tuples(st.just("Tokenize"), tokenize))


ALLOWED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
           grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNIMPLEMENTED}


@pytest.mark.timeout(1800)
def test_grpc_survives_fuzzed_messages(server):
    from pagedcore.serving.grpc.stubs import generation_pb2_grpc as pb_grpc

    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = pb_grpc.GenerationServiceStub(channel)

        @settings(max_examples=FUZZ_EXAMPLES * 6, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(call=_messages())
        def run(call):
            method, message = call
            try:
                result = getattr(stub, method)(message, timeout=CALL_TIMEOUT_S)
                if method == "GenerateStream":
                    list(result)
                code = grpc.StatusCode.OK
            except grpc.RpcError as error:
                code = error.code()
                assert code in ALLOWED, f"{method}({message}) -> {code.name}: {error.details()}"
            assert code != grpc.StatusCode.DEADLINE_EXCEEDED
            _still_serves(server.url)

        run()
