"""Generation under a corpus of 60 JSON schemas with the default model, at temperature 0 and 1:
every output that finishes validates with `jsonschema` (formats checked where jsonschema can).

Outputs cut by max_tokens cannot be validated (a JSON prefix); the grammar admitted every token of
them all the same. The model is small and the suite's schemas are odd ({"type": "integer"} invites
an endless number), so some do not finish: the test counts them and asks that most finish.
"""

from __future__ import annotations

import json

import pytest

jsonschema = pytest.importorskip("jsonschema")
xgr = pytest.importorskip("xgrammar")

from pagedcore.sampling_params import SamplingParams, StructuredOutputsParams  # noqa: E402
from pagedcore.structured_output.schema_support import unsupported_reason  # noqa: E402
from tests.structured_output.schema_corpus import generation_corpus  # noqa: E402

NUM_SUITE = 38      # + 22 realistic = 60 schemas
MAX_TOKENS = 96


def compiles(schema) -> bool:
    if unsupported_reason(schema) is not None:
        return False
    try:
        xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=True)
    except (RuntimeError, ValueError):
        return False
    return True


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_finished_output_validates_against_its_schema():
    from pagedcore import LLM

    corpus = generation_corpus(NUM_SUITE, compiles)
    assert len(corpus) >= 60
    llm = LLM(dtype="float32", kv_cache_memory="256MiB", max_model_len=1024, max_num_seqs=128)
    tokenizer = llm.get_tokenizer()
    names = list(corpus)
    prompts = [tokenizer.apply_chat_template(
        [{"role": "user", "content": "Reply with one JSON value that follows this JSON schema:\n"
                                     + json.dumps(corpus[name])}], tokenize=False, add_generation_prompt=True)
        for name in names]
    params = [SamplingParams(temperature=temperature, seed=i, max_tokens=MAX_TOKENS,
                             structured_outputs=StructuredOutputsParams(json=corpus[name]))
              for temperature in (0.0, 1.0) for i, name in enumerate(names)]
    outputs = llm.generate(prompts * 2, params, use_tqdm=False)
    checker = jsonschema.FormatChecker()
    finished = {0.0: 0, 1.0: 0}
    invalid = []
    for k, output in enumerate(outputs):
        temperature, name = (0.0, 1.0)[k // len(names)], names[k % len(names)]
        completion = output.outputs[0]
        if completion.finish_reason != "stop":
            continue
        finished[temperature] += 1
        try:
            jsonschema.validate(json.loads(completion.text), corpus[name], format_checker=checker)
        except (ValueError, jsonschema.ValidationError) as error:
            invalid.append(f"T={temperature} {name}: {completion.text[:80]!r}: {str(error)[:120]}")
    assert invalid == []
    # 65 of 75 finished at T=0 when measured; odd suite schemas ({"type": "integer"}) may not.
    assert finished[0.0] >= 45 and finished[1.0] >= 35, finished
