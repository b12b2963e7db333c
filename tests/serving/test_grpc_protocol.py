"""The gRPC front end without an engine: the wire contract against TGIS, parameter translation and
refusals, stop reasons, token details, status codes, API keys, stream plumbing, stub generation."""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

import grpc
import pytest

from pagedcore.outputs import CompletionOutput, Logprob, RequestOutput
from pagedcore.serving.async_engine import EngineDeadError, EngineDrainingError, QueueFullError
from pagedcore.serving.grpc import responses
from pagedcore.serving.grpc.auth import ApiKeyInterceptor, bearer_key
from pagedcore.serving.grpc.errors import ServerDrainingError, status_of
from pagedcore.serving.grpc.params import ParamError, TokenDetail, check_request, plan_generation
from pagedcore.serving.grpc.streams import TIME_LIMIT, run_all, until_deadline
from pagedcore.serving.grpc.stubs import generation_pb2 as pb

StopReason = pb.StopReason
PROTO = Path(__file__).resolve().parents[2] / "proto" / "generation.proto"

# The public TGIS generation.proto (IBM/text-generation-inference), field by field: a client built
# from it must find every one of these at the same number.
TGIS_FIELDS = {
    "BatchedGenerationRequest": {"model_id": 1, "prefix_id": 2, "requests": 3, "params": 10},
    "SingleGenerationRequest": {"model_id": 1, "prefix_id": 2, "request": 3, "params": 10},
    "BatchedGenerationResponse": {"responses": 1},
    "GenerationRequest": {"text": 2},
    "GenerationResponse": {"input_token_count": 6, "generated_token_count": 2, "text": 4, "stop_reason": 7,
                           "stop_sequence": 11, "seed": 10, "tokens": 8, "input_tokens": 9},
    "Parameters": {"method": 1, "sampling": 2, "stopping": 3, "response": 4, "decoding": 5,
                   "truncate_input_tokens": 6},
    "DecodingParameters": {"repetition_penalty": 1, "length_penalty": 2},
    "DecodingParameters.LengthPenalty": {"start_index": 1, "decay_factor": 2},
    "SamplingParameters": {"temperature": 1, "top_k": 2, "top_p": 3, "typical_p": 4, "seed": 5},
    "StoppingCriteria": {"max_new_tokens": 1, "min_new_tokens": 2, "time_limit_millis": 3, "stop_sequences": 4,
                         "include_stop_sequence": 5},
    "ResponseOptions": {"input_text": 1, "generated_tokens": 2, "input_tokens": 3, "token_logprobs": 4,
                        "token_ranks": 5, "top_n_tokens": 6},
    "TokenInfo": {"text": 2, "logprob": 3, "rank": 4, "top_tokens": 5},
    "TokenInfo.TopToken": {"text": 2, "logprob": 3},
    "BatchedTokenizeRequest": {"model_id": 1, "requests": 2, "return_tokens": 3, "return_offsets": 4,
                               "truncate_input_tokens": 5},
    "BatchedTokenizeResponse": {"responses": 1},
    "TokenizeRequest": {"text": 1},
    "TokenizeResponse": {"token_count": 1, "tokens": 2, "offsets": 3},
    "TokenizeResponse.Offset": {"start": 1, "end": 2},
    "ModelInfoRequest": {"model_id": 1},
    "ModelInfoResponse": {"model_kind": 1, "max_sequence_length": 2, "max_new_tokens": 3},
}
TGIS_ENUMS = {
    "DecodingMethod": {"GREEDY": 0, "SAMPLE": 1},
    "StopReason": {"NOT_FINISHED": 0, "MAX_TOKENS": 1, "EOS_TOKEN": 2, "CANCELLED": 3, "TIME_LIMIT": 4,
                   "STOP_SEQUENCE": 5, "TOKEN_LIMIT": 6, "ERROR": 7},
    "ModelInfoResponse.ModelKind": {"DECODER_ONLY": 0, "ENCODER_DECODER": 1},
}
TGIS_METHODS = {"Generate": ("BatchedGenerationRequest", "BatchedGenerationResponse", False),
                "GenerateStream": ("SingleGenerationRequest", "GenerationResponse", True),
                "Tokenize": ("BatchedTokenizeRequest", "BatchedTokenizeResponse", False),
                "ModelInfo": ("ModelInfoRequest", "ModelInfoResponse", False)}


def _message(path: str):
    descriptor = pb.DESCRIPTOR.message_types_by_name[path.split(".")[0]]
    for part in path.split(".")[1:]:
        descriptor = descriptor.nested_types_by_name[part]
    return descriptor


# -- the wire contract ------------------------------------------------------------------------------
def test_wire_contract_matches_tgis():
    assert pb.DESCRIPTOR.package == "fmaas"
    for message, fields in TGIS_FIELDS.items():
        numbers = {f.name: f.number for f in _message(message).fields}
        assert {name: numbers.get(name) for name in fields} == fields, message
    for enum, values in TGIS_ENUMS.items():
        if "." in enum:
            parent, name = enum.rsplit(".", 1)
            descriptor = _message(parent).enum_types_by_name[name]
        else:
            descriptor = pb.DESCRIPTOR.enum_types_by_name[enum]
        assert {v.name: v.number for v in descriptor.values} == values, enum
    service = pb.DESCRIPTOR.services_by_name["GenerationService"]
    assert service.full_name == "fmaas.GenerationService"
    for name, (request, response, streaming) in TGIS_METHODS.items():
        method = service.methods_by_name[name]
        assert (method.input_type.name, method.output_type.name) == (request, response)
        assert method.server_streaming is streaming and method.client_streaming is False


def test_generated_stubs_import_inside_the_package(tmp_path):
    pytest.importorskip("grpc_tools")
    from pagedcore.serving.grpc.stubs import generate_stubs

    folder = generate_stubs(PROTO, tmp_path)
    assert folder.parts[-3:] == ("pagedcore", "serving", "grpc_gen")
    grpc_module = (folder / "generation_pb2_grpc.py").read_text()
    assert "from pagedcore.serving.grpc_gen import generation_pb2" in grpc_module
    assert (folder / "generation_pb2.pyi").is_file()
    assert generate_stubs(PROTO, tmp_path) == folder   # cached by the .proto's hash


# -- parameters -------------------------------------------------------------------------------------
def plan(**parts):
    return plan_generation(pb.Parameters(**parts), max_logprobs=20)


def test_defaults_are_tgis_defaults():
    p = plan()
    sp = p.sampling_params
    assert sp.temperature == 0 and sp.max_tokens == 20 and sp.min_tokens == 0
    assert sp.include_stop_str_in_output is True and sp.stop == [] and sp.repetition_penalty == 1
    assert sp.logprobs is None and sp.prompt_logprobs is None
    assert p.seed is None and p.time_limit_s is None and p.truncate_input_tokens == 0


def test_greedy_ignores_sampling_fields():
    sp = plan(sampling=pb.SamplingParameters(temperature=0.7, top_k=5, top_p=0.5, typical_p=0.5)).sampling_params
    assert (sp.temperature, sp.top_k, sp.top_p) == (0, 0, 1)


def test_sample_translation():
    p = plan(method=pb.SAMPLE, sampling=pb.SamplingParameters(temperature=0.7, top_k=5, top_p=0.9, seed=7),
             stopping=pb.StoppingCriteria(max_new_tokens=9, min_new_tokens=2, time_limit_millis=1500,
                                          stop_sequences=["\n\n", "END"], include_stop_sequence=False),
             decoding=pb.DecodingParameters(repetition_penalty=1.2), truncate_input_tokens=100)
    sp = p.sampling_params
    assert sp.temperature == pytest.approx(0.7) and (sp.top_k, sp.seed) == (5, 7) and sp.top_p == pytest.approx(0.9)
    assert (sp.max_tokens, sp.min_tokens, sp.stop, sp.include_stop_str_in_output) == (9, 2, ["\n\n", "END"], False)
    assert sp.repetition_penalty == pytest.approx(1.2)
    assert (p.seed, p.time_limit_s, p.truncate_input_tokens) == (7, 1.5, 100)


def test_sample_defaults_and_a_drawn_seed():
    p = plan(method=pb.SAMPLE)
    assert (p.sampling_params.temperature, p.sampling_params.top_p, p.sampling_params.top_k) == (1, 1, 0)
    assert p.seed is not None and p.sampling_params.seed == p.seed
    explicit_zero = plan(method=pb.SAMPLE, sampling=pb.SamplingParameters(temperature=0))
    assert explicit_zero.sampling_params.temperature == 0   # set explicitly: greedy, as vllm-tgis-adapter


@pytest.mark.parametrize("response, logprobs, prompt_logprobs", [
    (pb.ResponseOptions(generated_tokens=True), None, None),
    (pb.ResponseOptions(generated_tokens=True, token_logprobs=True), 0, None),
    (pb.ResponseOptions(generated_tokens=True, token_ranks=True, top_n_tokens=3), 3, None),
    (pb.ResponseOptions(input_tokens=True, token_logprobs=True, top_n_tokens=2), None, 2),
    (pb.ResponseOptions(input_tokens=True), None, None),
])
def test_token_details_ask_the_engine_for_logprobs(response, logprobs, prompt_logprobs):
    sp = plan(response=response).sampling_params
    assert (sp.logprobs, sp.prompt_logprobs) == (logprobs, prompt_logprobs)


@pytest.mark.parametrize("parts, message", [
    (dict(method=pb.SAMPLE, sampling=pb.SamplingParameters(top_p=1.5)),
     "params.sampling.top_p must be in (0, 1] (0 = off), got 1.5"),
    (dict(method=pb.SAMPLE, sampling=pb.SamplingParameters(top_p=math.nan)),
     "params.sampling.top_p must be a finite number, got nan"),
    (dict(method=pb.SAMPLE, sampling=pb.SamplingParameters(temperature=0.01)),
     "params.sampling.temperature must be 0 (greedy) or >= 0.05, got 0.01"),
    (dict(sampling=pb.SamplingParameters(temperature=-1)),   # checked under GREEDY too: a client bug
     "params.sampling.temperature must be 0 (greedy) or >= 0.05, got -1"),
    (dict(method=pb.SAMPLE, sampling=pb.SamplingParameters(typical_p=0.5)), "params.sampling.typical_p (0.5)"),
    (dict(sampling=pb.SamplingParameters(typical_p=2)), "params.sampling.typical_p must be in [0, 1]"),
    (dict(stopping=pb.StoppingCriteria(max_new_tokens=2000)),
     "params.stopping.max_new_tokens must be <= 1024 (this server's limit), got 2000"),
    (dict(stopping=pb.StoppingCriteria(min_new_tokens=21)),
     "params.stopping.min_new_tokens must be <= max_new_tokens (20), got 21"),
    (dict(stopping=pb.StoppingCriteria(stop_sequences=["a"] * 7)), "params.stopping.stop_sequences must hold at most 6"),
    (dict(stopping=pb.StoppingCriteria(stop_sequences=[""])), "params.stopping.stop_sequences must hold"),
    (dict(stopping=pb.StoppingCriteria(stop_sequences=["é" * 121])), "params.stopping.stop_sequences must hold"),
    (dict(decoding=pb.DecodingParameters(repetition_penalty=-0.5)),
     "params.decoding.repetition_penalty must be in (0, 2] (0 = off), got -0.5"),
    (dict(decoding=pb.DecodingParameters(length_penalty=pb.DecodingParameters.LengthPenalty(decay_factor=1.5))),
     "params.decoding.length_penalty is not supported"),
    (dict(decoding=pb.DecodingParameters(json_schema="not json")), "params.decoding.json_schema is invalid"),
    (dict(decoding=pb.DecodingParameters(json_schema="[1]")), "params.decoding.json_schema is invalid"),
    (dict(decoding=pb.DecodingParameters(choice=pb.DecodingParameters.StringChoices())),
     "params.decoding.choice is invalid"),
    (dict(decoding=pb.DecodingParameters(regex="")), "params.decoding.regex is invalid"),
    (dict(response=pb.ResponseOptions(generated_tokens=True, top_n_tokens=11)),
     "params.response.top_n_tokens must be <= 10, got 11"),
    (dict(response=pb.ResponseOptions(token_ranks=True)), "params.response asks for token_logprobs"),
])
def test_refusals_name_the_field(parts, message):
    with pytest.raises(ParamError) as refused:
        plan(**parts)
    assert str(refused.value).startswith(message)


def test_top_n_is_capped_by_the_engine_max_logprobs():
    with pytest.raises(ParamError, match=r"top_n_tokens must be <= 4, got 5"):
        plan_generation(pb.Parameters(response=pb.ResponseOptions(generated_tokens=True, top_n_tokens=5)),
                        max_logprobs=4)


def test_accepted_edge_values():
    plan(method=pb.SAMPLE, sampling=pb.SamplingParameters(typical_p=1.0, top_p=1.0))
    plan(decoding=pb.DecodingParameters(format=pb.DecodingParameters.TEXT, repetition_penalty=2.0))
    fmt = pb.DecodingParameters
    assert plan(decoding=fmt(format=fmt.TEXT)).sampling_params.structured_outputs is None
    assert plan(decoding=fmt(format=fmt.JSON)).sampling_params.structured_outputs.json_object
    assert plan(decoding=fmt(json_schema="{}")).sampling_params.structured_outputs.json == "{}"
    plan(stopping=pb.StoppingCriteria(max_new_tokens=1024, min_new_tokens=1024))


def test_fit_truncates_from_the_left_and_caps_to_max_model_len():
    p = plan(stopping=pb.StoppingCriteria(max_new_tokens=10), truncate_input_tokens=4)
    fitted = p.fit(list(range(1, 9)), max_model_len=100, field="requests[0].text")
    assert fitted.token_ids == [5, 6, 7, 8] and fitted.sampling_params.max_tokens == 10
    assert not fitted.token_limited
    capped = p.fit(list(range(1, 9)), max_model_len=8, field="requests[0].text")
    assert capped.sampling_params.max_tokens == 4 and capped.token_limited
    assert p.sampling_params.max_tokens == 10   # the shared plan is left alone


def test_fit_refusals():
    p = plan(stopping=pb.StoppingCriteria(max_new_tokens=10, min_new_tokens=5))
    with pytest.raises(ParamError, match=r"^requests\[1\]\.text is empty"):
        p.fit([], max_model_len=64, field="requests[1].text")
    with pytest.raises(ParamError) as too_long:
        p.fit([1] * 64, max_model_len=64, field="request.text")
    assert str(too_long.value) == ("request.text has 64 tokens but max_model_len is 64, which leaves no room to "
                                   "generate; shorten it or set params.truncate_input_tokens <= 63")
    with pytest.raises(ParamError, match=r"^params\.stopping\.min_new_tokens \(5\) plus the 62 prompt tokens"):
        p.fit([1] * 62, max_model_len=64, field="request.text")


def test_prefix_and_adapter_ids_are_refused_when_set():
    check_request(pb.BatchedGenerationRequest(prefix_id="", model_id="any"))   # set but empty: nothing asked
    for name in ("prefix_id", "adapter_id"):
        with pytest.raises(ParamError, match=f"^{name} "):
            check_request(pb.SingleGenerationRequest(**{name: "x"}))
    with pytest.raises(ParamError, match="^adapter_id "):
        check_request(pb.BatchedTokenizeRequest(adapter_id="x"))


# -- responses --------------------------------------------------------------------------------------
@pytest.mark.parametrize("finish, reason, token_limited, time_limited, expected", [
    (None, None, False, False, (StopReason.NOT_FINISHED, "")),
    (None, None, False, True, (StopReason.TIME_LIMIT, "")),
    ("length", None, False, False, (StopReason.MAX_TOKENS, "")),
    ("length", None, True, False, (StopReason.TOKEN_LIMIT, "")),
    ("stop", None, False, False, (StopReason.EOS_TOKEN, "")),
    ("stop", 7, False, False, (StopReason.EOS_TOKEN, "")),
    ("stop", "END", False, False, (StopReason.STOP_SEQUENCE, "END")),
    ("abort", None, False, False, (StopReason.CANCELLED, "")),
])
def test_stop_reasons(finish, reason, token_limited, time_limited, expected):
    assert responses.stop_reason(finish, reason, token_limited=token_limited, time_limited=time_limited) == expected


class VocabTokenizer:
    def convert_ids_to_tokens(self, ids):
        return [f"t{i}" for i in ids]


def test_token_infos():
    logprobs = [None,
                {5: Logprob(-0.1, 1), 6: Logprob(-2.5, 2), 7: Logprob(-3.0, 3)},
                {9: Logprob(-4.0, 12), 5: Logprob(-0.2, 1), 6: Logprob(-1.9, 2)}]
    infos = responses.token_infos(VocabTokenizer(), [4, 5, 9], logprobs,
                                  TokenDetail(generated_tokens=True, logprobs=True, ranks=True, top_n=2))
    assert [i.text for i in infos] == ["t4", "t5", "t9"]
    assert (infos[0].logprob, infos[0].rank, len(infos[0].top_tokens)) == (0, 0, 0)
    assert infos[1].logprob == pytest.approx(-0.1) and infos[1].rank == 1
    assert [t.text for t in infos[1].top_tokens] == ["t5", "t6"]
    # A chosen token outside the top N: its own rank, and the top N without it.
    assert infos[2].rank == 12 and [t.text for t in infos[2].top_tokens] == ["t5", "t6"]
    plain = responses.token_infos(VocabTokenizer(), [4, 5], logprobs[:2], TokenDetail(generated_tokens=True))
    assert plain[1].logprob == 0 and plain[1].rank == 0 and not plain[1].top_tokens


def output(text, ids, finish=None, reason=None, logprobs=None):
    return RequestOutput("r", None, [1, 2], None, [CompletionOutput(0, text, ids, None, logprobs, finish, reason)],
                         finished=finish is not None)


def test_progress_sums_deltas():
    progress = responses.Progress()
    progress.add(output("Hel", [1]))
    delta = progress.add(output("lo", [2], "stop", "END"))
    assert (delta.text, progress.text, progress.token_ids) == ("lo", "Hello", [1, 2])
    assert (progress.finish_reason, progress.stop_reason) == ("stop", "END")


# -- status codes and keys --------------------------------------------------------------------------
@pytest.mark.parametrize("error, code", [
    (ParamError("params.x", "bad"), grpc.StatusCode.INVALID_ARGUMENT),
    (ValueError("prompt token ids must be in [0, 10)"), grpc.StatusCode.INVALID_ARGUMENT),
    (QueueFullError("full"), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (EngineDrainingError("draining"), grpc.StatusCode.UNAVAILABLE),
    (ServerDrainingError("draining"), grpc.StatusCode.UNAVAILABLE),
    (EngineDeadError("dead"), grpc.StatusCode.UNAVAILABLE),
    (RuntimeError("boom"), grpc.StatusCode.INTERNAL),
])
def test_status_codes(error, code):
    assert status_of(error)[0] == code


def test_bearer_keys():
    assert bearer_key([("authorization", "Bearer abc")]) == "abc"
    assert bearer_key([("x", "y"), ("authorization", "bearer  abc ")]) == "abc"
    assert bearer_key([("authorization", "abc")]) is None
    assert bearer_key([("authorization", "Bearer ")]) is None
    assert bearer_key(None) is None
    interceptor = ApiKeyInterceptor(["k1", "k2"])
    assert interceptor.allows([("authorization", "Bearer k2")])
    assert not interceptor.allows([("authorization", "Bearer k3")])
    with pytest.raises(ValueError, match="at least one non-empty key"):
        ApiKeyInterceptor([""])


# -- stream plumbing --------------------------------------------------------------------------------
class FakeStream:
    """An engine stream: yields `items` `delay` seconds apart; records whether it was closed early."""

    def __init__(self, items, delay=0.0, fail_with=None):
        self.items, self.delay, self.fail_with = items, delay, fail_with
        self.closed_early = False

    async def run(self):
        finished = False
        try:
            for item in self.items:
                await asyncio.sleep(self.delay)
                yield item
            if self.fail_with is not None:
                raise self.fail_with
            finished = True
        finally:
            if not finished and self.fail_with is None:
                self.closed_early = True   # where the async engine aborts the request


async def collect(stream, deadline):
    return [item async for item in until_deadline(stream, deadline)]


def test_until_deadline_passes_everything_through_without_a_limit():
    fake = FakeStream([1, 2, 3])
    assert asyncio.run(collect(fake.run(), None)) == [1, 2, 3] and not fake.closed_early


def test_until_deadline_stops_and_closes_the_stream():
    async def main():
        fake = FakeStream(list(range(100)), delay=0.02)
        items = await collect(fake.run(), time.monotonic() + 0.1)
        return fake, items

    fake, items = asyncio.run(main())
    assert items[-1] is TIME_LIMIT and 0 < len(items) - 1 < 100 and fake.closed_early


def test_run_all_keeps_order_and_cancels_siblings_on_failure():
    async def value(v, delay):
        await asyncio.sleep(delay)
        return v

    assert asyncio.run(run_all([value(1, 0.02), value(2, 0.0)])) == [1, 2]

    async def main():
        slow = FakeStream(list(range(100)), delay=0.02)

        async def drain():
            return await collect(slow.run(), None)

        async def fail():
            await asyncio.sleep(0.05)
            raise QueueFullError("full")

        with pytest.raises(QueueFullError):
            await run_all([drain(), fail()])
        return slow

    assert asyncio.run(main()).closed_early
