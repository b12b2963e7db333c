"""Many streams at once, and clients that leave: 32 concurrent streaming clients all get the right
text; a client that disconnects (streaming or not) has its request aborted and its blocks freed,
seen through /metrics."""

from __future__ import annotations

import asyncio
import json
import socket
from urllib.parse import urlsplit

import httpx
import openai
import pytest

from tests.serving.http_helpers import MAX_MODEL_LEN, metric, wait_until

NUM_CLIENTS = 32
PROMPTS = ["The sky is", "My favourite food is", "In 1492,", "Python is a"]
MAX_TOKENS = 3


@pytest.mark.slow
def test_32_concurrent_streams_all_complete_with_the_right_text(http_server, openai_client):
    # Greedy: each prompt's reply is fixed, whatever else shares the batch.
    expected = {p: openai_client.completions.create(model="smol", prompt=p, max_tokens=MAX_TOKENS,
                                                    temperature=0).choices[0].text for p in PROMPTS}

    async def one(client: openai.AsyncOpenAI, prompt: str) -> tuple[str, str | None]:
        text, finish = "", None
        stream = await client.completions.create(model="smol", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                                 stream=True)
        async for chunk in stream:
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        return text, finish

    async def all_of_them():
        async with openai.AsyncOpenAI(base_url=http_server.url + "/v1", api_key="unused", max_retries=0,
                                      timeout=600) as client:
            prompts = [PROMPTS[i % len(PROMPTS)] for i in range(NUM_CLIENTS)]
            return prompts, await asyncio.gather(*(one(client, p) for p in prompts))

    prompts, results = asyncio.run(all_of_them())
    assert [finish for _, finish in results] == ["length"] * NUM_CLIENTS
    assert [text for text, _ in results] == [expected[p] for p in prompts]


def _idle(url: str) -> bool:
    return metric(url, "pagedcore:num_requests_running") == 0 and metric(url, "pagedcore:kv_cache_usage_perc") == 0


def test_a_streaming_client_that_disconnects_frees_its_blocks(http_server):
    url = http_server.url
    aborted = metric(url, "pagedcore:request_success_total", finished_reason="abort")
    body = {"model": "smol", "prompt": "Write a long story about a dragon.", "max_tokens": 500, "stream": True,
            "ignore_eos": True}
    with httpx.Client(timeout=120) as client:
        with client.stream("POST", url + "/v1/completions", json=body) as response:
            assert response.status_code == 200
            # Keep the iterator referenced: a discarded httpx line iterator closes the connection,
            # which would abort the request before the metrics below are read.
            lines = response.iter_lines()
            for line in lines:
                if line.startswith("data: {"):
                    break     # the first token arrived: the request is running and holds blocks
            assert metric(url, "pagedcore:num_requests_running") == 1
            assert metric(url, "pagedcore:kv_cache_usage_perc") > 0
        # leaving the block closes the connection mid-stream
    assert wait_until(lambda: _idle(url), timeout=60), "the aborted request still holds blocks"
    assert metric(url, "pagedcore:request_success_total", finished_reason="abort") == aborted + 1


def test_a_non_streaming_client_that_disconnects_frees_its_blocks(http_server):
    # A raw socket, hung up once /metrics shows the request running: a client read timeout instead
    # raced the generation (500 tokens took under 2 s on a quiet Zen 5 and the response arrived).
    url = http_server.url
    aborted = metric(url, "pagedcore:request_success_total", finished_reason="abort")
    body = json.dumps({"model": "smol", "messages": [{"role": "user", "content": "Tell me a long story."}],
                       "max_tokens": MAX_MODEL_LEN - 64, "ignore_eos": True}).encode()
    host, port = urlsplit(url).hostname, urlsplit(url).port
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % (host.encode(), len(body)) + body)
        assert wait_until(lambda: metric(url, "pagedcore:num_requests_running") == 1, timeout=60, interval=0.02)
    # leaving the block hangs up while the request still has hundreds of tokens to go
    assert wait_until(lambda: metric(url, "pagedcore:request_success_total", finished_reason="abort") == aborted + 1,
                      timeout=60), "the server did not notice the client left"
    assert wait_until(lambda: _idle(url), timeout=60)


def test_metrics_count_tokens_and_latencies(http_server, openai_client):
    url = http_server.url
    before = metric(url, "pagedcore:generation_tokens_total")
    ttft_before = metric(url, "pagedcore:time_to_first_token_seconds_count")
    openai_client.completions.create(model="smol", prompt="Hi", max_tokens=2, temperature=0)
    assert metric(url, "pagedcore:generation_tokens_total") == before + 2
    assert metric(url, "pagedcore:time_to_first_token_seconds_count") == ttft_before + 1
    text = httpx.get(url + "/metrics").text
    for name in ("num_requests_waiting", "num_requests_swapped", "prefix_cache_queries_total",
                 "prefix_cache_hits_total", "num_preemptions_total", "prompt_tokens_total",
                 "inter_token_latency_seconds_bucket", "e2e_request_latency_seconds_sum",
                 "request_queue_time_seconds_count", "iteration_tokens_total_bucket",
                 "request_prompt_tokens_bucket", "request_generation_tokens_bucket",
                 "time_per_output_token_seconds_count"):
        assert f"pagedcore:{name}" in text, name
    assert 'finished_reason="length"' in text
    # The KV cache, committed on a thread from start-up (--kv-cache-commit background): all of it, in time.
    target = metric(url, "pagedcore:kv_cache_commit_target_bytes")
    assert target >= 16 * 2**20
    assert wait_until(lambda: metric(url, "pagedcore:kv_cache_committed_bytes") == target, timeout=120)
