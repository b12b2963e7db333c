"""vLLM's `prompt_logprobs` request field on /v1/completions and /v1/chat/completions, held to HF
transformers' fp32 log-softmax and to the offline engine's values on a tiny random Llama (vocab 512).

Shape, as vLLM returns it: one entry per prompt token, null for the first, else
{"<token id>": {"logprob", "rank", "decoded_token"}} with the prompt's own token and the N most likely;
per choice on completions, at the top level on chat. -1 is the whole vocabulary (held to
--max-logprobs); a count > 0 (or -1) with stream=true is a 400, 0 streams in the first chunk."""

from __future__ import annotations

import json
import math

import httpx
import pytest
import torch

from pagedcore.serving.openai.errors import APIError
from pagedcore.serving.openai.params import requested_prompt_logprobs
from pagedcore.serving.openai.protocol import CompletionRequest
from pagedcore.serving.state import ServerState
from tests.models import tiny_models
from tests.serving.http_helpers import ServerProcess

VOCAB = tiny_models.VOCAB_SIZE
PROMPT = [1, 57, 200, 13, 88, 301, 45, 9, 120, 77, 3, 250]   # token ids of the tiny vocabulary


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(hf_model, folder, server): the tiny Llama and a server on it that allows the whole vocabulary."""
    hf_model = tiny_models.build_hf_model("llama")
    folder = tiny_models.save_hf_folder(hf_model, tmp_path_factory.mktemp("prompt_logprobs_tiny"))
    server = ServerProcess(folder, "--max-model-len", "256", "--max-logprobs", str(VOCAB), "--kv-cache-memory",
                           "16MiB")
    try:
        server.wait_ready()
        yield hf_model, folder, server
    finally:
        assert server.stop() == 0


def _hf_log_softmax(hf_model, ids: list[int]) -> torch.Tensor:
    return tiny_models.hf_logits(hf_model, ids).log_softmax(-1)   # [len(ids), vocab]; row p predicts p + 1


def _post(server, route: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + route, json=body, timeout=120)


def _check_against_hf(entries: list, ids: list[int], reference: torch.Tensor, num_top: int) -> None:
    """Every position: the prompt's own token with HF's logprob and rank, and exactly HF's top N."""
    assert len(entries) == len(ids) and entries[0] is None
    for p in range(1, len(ids)):
        row = reference[p - 1]                                         # [vocab]
        entry = {int(k): v for k, v in entries[p].items()}
        own = entry[ids[p]]
        assert own["logprob"] == pytest.approx(row[ids[p]].item(), abs=1e-3)
        assert own["rank"] == int((row >= row[ids[p]]).sum())
        top = row.topk(num_top).indices.tolist()
        assert set(entry) == set(top) | {ids[p]}
        for rank, token_id in enumerate(top, start=1):
            assert entry[token_id]["logprob"] == pytest.approx(row[token_id].item(), abs=1e-3)
            if token_id != ids[p]:
                assert entry[token_id]["rank"] == rank
            assert isinstance(entry[token_id]["decoded_token"], str)


def test_completions_prompt_logprobs_equal_hf_and_the_engine(tiny):
    hf_model, folder, server = tiny
    r = _post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "temperature": 0,
                                          "prompt_logprobs": 3, "n": 2, "seed": 1})
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert len(choices) == 2 and choices[0]["prompt_logprobs"] == choices[1]["prompt_logprobs"]
    entries = choices[0]["prompt_logprobs"]
    _check_against_hf(entries, PROMPT, _hf_log_softmax(hf_model, PROMPT), 3)

    from pagedcore import LLM, SamplingParams   # the offline engine: the same numbers reach the client

    llm = LLM(folder, max_model_len=256, kv_cache_memory="16MiB")
    out = llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(max_tokens=1, prompt_logprobs=3),
                       use_tqdm=False)[0]
    for p in range(1, len(PROMPT)):
        served = {int(k): v for k, v in entries[p].items()}
        assert set(served) == set(out.prompt_logprobs[p])
        for token_id, lp in out.prompt_logprobs[p].items():
            assert served[token_id]["logprob"] == pytest.approx(lp.logprob, abs=1e-6)
            assert served[token_id]["rank"] == lp.rank


def test_chat_prompt_logprobs_are_top_level_and_equal_hf(tiny):
    hf_model, _, server = tiny
    messages = [{"role": "user", "content": "The quick brown fox"}]
    ids = _post(server, "/tokenize", {"messages": messages}).json()["tokens"]
    r = _post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 1, "temperature": 0,
                                               "prompt_logprobs": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    assert "prompt_logprobs" not in body["choices"][0]
    _check_against_hf(body["prompt_logprobs"], ids, _hf_log_softmax(hf_model, ids), 2)


def test_minus_one_is_the_whole_vocabulary(tiny):
    hf_model, _, server = tiny
    r = _post(server, "/v1/completions", {"prompt": PROMPT[:6], "max_tokens": 1, "prompt_logprobs": -1})
    assert r.status_code == 200, r.text
    entries = r.json()["choices"][0]["prompt_logprobs"]
    reference = _hf_log_softmax(hf_model, PROMPT[:6])
    for p in range(1, 6):
        assert len(entries[p]) == VOCAB
        assert math.fsum(math.exp(v["logprob"]) for v in entries[p].values()) == pytest.approx(1.0, abs=1e-4)
    _check_against_hf(entries, PROMPT[:6], reference, VOCAB)

    from pagedcore import LLM, SamplingParams   # offline, -1 is resolved by the engine the same way

    llm = LLM(tiny[1], max_model_len=256, kv_cache_memory="16MiB", max_logprobs=VOCAB)
    out = llm.generate({"prompt_token_ids": PROMPT[:6]}, SamplingParams(max_tokens=1, prompt_logprobs=-1),
                       use_tqdm=False)[0]
    assert [len(p) for p in out.prompt_logprobs[1:]] == [VOCAB] * 5
    with pytest.raises(ValueError, match="max_logprobs"):
        LLM(tiny[1], max_model_len=256, kv_cache_memory="16MiB").generate(
            {"prompt_token_ids": PROMPT[:6]}, SamplingParams(max_tokens=1, prompt_logprobs=-1), use_tqdm=False)


def test_echo_and_prompt_logprobs_share_rows_each_with_its_own_count(tiny):
    hf_model, _, server = tiny
    r = _post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 1, "temperature": 0, "echo": True,
                                          "logprobs": 4, "prompt_logprobs": 1})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    _check_against_hf(choice["prompt_logprobs"], PROMPT, _hf_log_softmax(hf_model, PROMPT), 1)
    # echo's logprobs (keyed by text, OpenAI's shape) come from the same rows: the prompt tokens' values agree.
    echoed = choice["logprobs"]["token_logprobs"][:len(PROMPT)]
    assert echoed[0] is None and choice["logprobs"]["top_logprobs"][0] is None
    assert echoed[1:] == [choice["prompt_logprobs"][p][str(PROMPT[p])]["logprob"] for p in range(1, len(PROMPT))]


def test_prompt_logprobs_zero_streams_in_the_first_chunk(tiny):
    hf_model, _, server = tiny
    body = {"prompt": PROMPT, "max_tokens": 3, "temperature": 0, "ignore_eos": True, "stream": True,
            "prompt_logprobs": 0}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    carrying = [c for c in chunks if "prompt_logprobs" in c["choices"][0]]
    assert carrying and carrying[0] is chunks[0] and len(carrying) == 1
    _check_against_hf(carrying[0]["choices"][0]["prompt_logprobs"], PROMPT, _hf_log_softmax(hf_model, PROMPT), 0)

    chat = {"messages": [{"role": "user", "content": "fox"}], "max_tokens": 2, "stream": True, "prompt_logprobs": 0}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=chat, timeout=120) as r:
        assert r.status_code == 200
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant" and chunks[0]["prompt_logprobs"][0] is None
    assert all("prompt_logprobs" not in c for c in chunks[1:])


@pytest.mark.parametrize("route,extra", [("/v1/completions", {"prompt": PROMPT}),
                                         ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})])
@pytest.mark.parametrize("fields,needle", [
    ({"prompt_logprobs": -2}, "must be >= 0, or -1"),
    ({"prompt_logprobs": VOCAB + 1}, f"--max-logprobs {VOCAB + 1}"),
    ({"prompt_logprobs": 1, "stream": True}, "not available with \"stream\": true"),
    ({"prompt_logprobs": -1, "stream": True}, "not available with \"stream\": true"),
    ({"prompt_logprobs": "2"}, "prompt_logprobs"),
    ({"prompt_logprobs": True}, "prompt_logprobs"),
    ({"prompt_logprobs": 1, "use_beam_search": True, "n": 2, "temperature": 0}, "use_beam_search"),
])
def test_refusals_name_the_field(tiny, route, extra, fields, needle):
    _, _, server = tiny
    r = _post(server, route, {**extra, "max_tokens": 1, **fields})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "prompt_logprobs" and needle in error["message"], error


def test_minus_one_is_held_to_max_logprobs_with_the_value_that_allows_it():
    state = ServerState(served_model_names=["m"])
    state.vocab_size, state.max_logprobs = 49152, 20
    with pytest.raises(APIError) as refused:
        requested_prompt_logprobs(CompletionRequest(prompt="x", prompt_logprobs=-1), state)
    assert refused.value.param == "prompt_logprobs" and "--max-logprobs 49152" in refused.value.message
    state.max_logprobs = 49152
    assert requested_prompt_logprobs(CompletionRequest(prompt="x", prompt_logprobs=-1), state) == 49152
    assert requested_prompt_logprobs(CompletionRequest(prompt="x", prompt_logprobs=5), state) == 5
    assert requested_prompt_logprobs(CompletionRequest(prompt="x"), state) is None
