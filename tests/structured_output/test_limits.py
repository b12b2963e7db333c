"""The bounds on what GrammarCache compiles (structured_output/limits.py): the size of the constraint's
text and the compile time. Refusals are ConstraintError (a ValueError) naming the field and the fix; an
overrun compile is remembered as refused, never cached as good; the cache's hit / miss counts and
compile-time listeners (what /metrics exports)."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from pagedcore.sampling_params import SamplingParams
from pagedcore.sampling_params import StructuredOutputsParams as S
from pagedcore.structured_output.compiler import ConstraintError, GrammarCache
from pagedcore.structured_output.limits import ConstraintLimits, constraint_bytes
from tests.models import tiny_models

# A string pattern with nested repetition counts: xgrammar expands it at compile time, which takes
# far longer (a second or more) than the tiny timeouts below, yet the text is a few dozen bytes.
SLOW_SCHEMA = {"type": "string", "pattern": "^(a{1,9}b{1,9}){1,600}$"}
HUGE_SCHEMA = {"type": "object", "properties": {f"field_{i}": {"type": "string"} for i in range(5000)}}


def run_alone(coroutine):
    """Runs a coroutine on a fresh loop in a thread of its own (a test before may have left a loop here)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def cache_with(**limits) -> GrammarCache:
    return GrammarCache(tiny_models.make_tokenizer(), tiny_models.VOCAB_SIZE, [2], ConstraintLimits(**limits))


def test_sizes_count_the_text_the_client_sent():
    assert constraint_bytes(S(regex="ab")) == 2 and constraint_bytes(S(choice=["é", "xy"])) == 4
    assert constraint_bytes(S(json={"type": "object"})) == len('{"type":"object"}')
    assert constraint_bytes(S(json='{"type": "object"}')) == len('{"type": "object"}')
    assert constraint_bytes(S(json_object=True)) == 0


@pytest.mark.parametrize("kwargs", [{"max_bytes": 0}, {"compile_timeout_s": 0}, {"compile_timeout_s": "1"}])
def test_limits_must_be_positive(kwargs):
    with pytest.raises(ValueError, match="ConstraintLimits"):
        ConstraintLimits(**kwargs)


def test_a_huge_schema_is_refused_before_compiling():
    cache = cache_with(max_bytes=64 << 10)
    with pytest.raises(ConstraintError) as refused:
        cache.compile(S(json=HUGE_SCHEMA))
    error = refused.value
    assert error.field == "json" and error.limit == "max_bytes" and isinstance(error, ValueError)
    assert "more than the limit of 65536" in str(error) and "--structured-outputs-max-bytes" in str(error)
    assert cache.num_misses == 0 and cache._compiler is None     # xgrammar never saw it


def test_a_slow_compile_is_refused_and_never_cached_as_good():
    cache = cache_with(compile_timeout_s=0.02)
    for _ in range(2):   # the second time from the refusal list: no second runaway compile
        with pytest.raises(ConstraintError) as refused:
            cache.compile(S(json=SLOW_SCHEMA))
        assert refused.value.limit == "compile_timeout_s"
        assert "longer than 0.02 s" in str(refused.value) and "--structured-outputs-compile-timeout" in str(refused.value)
    assert cache.num_misses == 1 and S(json=SLOW_SCHEMA).key not in cache._grammars
    # Other constraints still compile while the overrun one finishes in the background.
    cache.limits = ConstraintLimits(compile_timeout_s=60)
    assert cache.compile(S(regex="[ab]{2}")) is not None


def test_hits_misses_and_compile_times_are_counted():
    cache = cache_with()
    seconds = []
    cache.compile_listeners.append(seconds.append)
    cache.compile(S(regex="[ab]{2}"))
    cache.compile(S(regex="[ab]{2}"))
    cache.compile(S(choice=["x", "y"]))
    with pytest.raises(ConstraintError):
        cache.compile(S(regex="(ab"))
    assert (cache.num_hits, cache.num_misses) == (1, 3) and len(seconds) == 2 and all(s >= 0 for s in seconds)


def test_offline_refusals_are_value_errors_and_the_engine_carries_on(tiny_llm):
    grammars = tiny_llm.llm_engine.grammars
    saved = grammars.limits
    grammars.limits = ConstraintLimits(max_bytes=4096, compile_timeout_s=0.02)
    try:
        params = SamplingParams(max_tokens=4, structured_outputs=S(json=HUGE_SCHEMA))
        with pytest.raises(ValueError, match=r"structured_outputs.json could not be compiled: it is \d+ bytes"):
            tiny_llm.generate(["Hi"], params, use_tqdm=False)
        params = SamplingParams(max_tokens=4, structured_outputs=S(json=json.dumps(SLOW_SCHEMA)))
        with pytest.raises(ValueError, match="compiling it took longer than 0.02 s"):
            tiny_llm.generate(["Hi"], params, use_tqdm=False)
    finally:
        grammars.limits = saved
    assert not tiny_llm.llm_engine.has_unfinished_requests()
    out = tiny_llm.generate(["Hi"], SamplingParams(max_tokens=4, structured_outputs=S(choice=["yes", "no"])),
                            use_tqdm=False)[0].outputs[0]
    assert out.text in ("yes", "no")


def test_http_maps_a_slow_compile_to_a_400_naming_the_field():
    from types import SimpleNamespace

    from pagedcore.serving.openai.errors import APIError
    from pagedcore.serving.openai.structured import Constraint, check_compiles

    engine = SimpleNamespace(engine=SimpleNamespace(grammars=cache_with(compile_timeout_s=0.02)))
    constraint = Constraint(S(json=SLOW_SCHEMA), "response_format.json_schema.schema")
    with pytest.raises(APIError) as refused:
        run_alone(check_compiles(engine, constraint))
    error = refused.value
    assert error.status == 400 and error.param == "response_format.json_schema.schema"
    assert error.message.startswith("response_format.json_schema.schema could not be compiled: compiling it took")


def test_grpc_maps_a_slow_compile_to_invalid_argument_naming_the_field():
    from types import SimpleNamespace

    from pagedcore.serving.grpc.params import ParamError
    from pagedcore.serving.grpc.servicer import GenerationServicer
    from pagedcore.serving.grpc.stubs import generation_pb2 as pb

    servicer = GenerationServicer.__new__(GenerationServicer)   # only what _plan reads
    servicer.engine = SimpleNamespace(engine=SimpleNamespace(grammars=cache_with(compile_timeout_s=0.02)))
    servicer.draining, servicer.max_new_tokens_limit, servicer.max_logprobs = False, 1024, 20
    servicer.default_include_stop_sequence = True
    servicer.lora_manager = None
    params = pb.Parameters(decoding=pb.DecodingParameters(json_schema=json.dumps(SLOW_SCHEMA)))
    request = pb.BatchedGenerationRequest(requests=[pb.GenerationRequest(text="Hi")], params=params)
    with pytest.raises(ParamError) as refused:
        run_alone(servicer._plan(request))
    assert refused.value.field == "params.decoding.json_schema"
    assert str(refused.value).startswith("params.decoding.json_schema could not be compiled: compiling it took")
