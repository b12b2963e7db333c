"""What the HTTP API does with input real clients get wrong or abuse: non-JSON bodies (415), an
empty model (the default one), continuous usage stats on every chunk, the chat role chunk after
the prefill, and header abuse (huge, too many, trickled: 431 or a closed connection, in bounded
time). On the session's shared server (conftest.py)."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest

from pagedcore.serving.http_protocol import HEADER_TIMEOUT_S, MAX_HEADER_BYTES
from pagedcore.serving.openai.body import read_body_in_time
from pagedcore.serving.openai.errors import APIError

P = {"model": "smol", "prompt": "Hi", "max_tokens": 2, "temperature": 0}
M = {"model": "smol", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0}


@pytest.fixture(scope="module")
def http(http_server):
    with httpx.Client(base_url=http_server.url, timeout=300) as client:
        yield client


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                          "application/xml"])
@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions", "/tokenize"])
def test_a_body_that_is_not_json_is_a_415(http, route, content_type):
    response = http.post(route, content=json.dumps(P), headers={"Content-Type": content_type})
    assert response.status_code == 415, response.text
    error = response.json()["error"]
    assert "Content-Type: application/json" in error["message"] and content_type in error["message"]


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8",
                                          "application/merge-patch+json", None])
def test_json_content_types_and_none_are_read(http, content_type):
    headers = {} if content_type is None else {"Content-Type": content_type}
    response = http.post("/v1/completions", content=json.dumps(P), headers=headers)
    assert response.status_code == 200, response.text


def test_an_empty_model_is_the_default_model(http):
    for route, body in (("/v1/completions", P), ("/v1/chat/completions", M)):
        response = http.post(route, json={**body, "model": ""})
        assert response.status_code == 200, response.text
        assert response.json()["model"] == "smol"


def _sse_chunks(http: httpx.Client, route: str, body: dict) -> list[dict]:
    with http.stream("POST", route, json=body) as response:
        assert response.status_code == 200, response.read()
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize("route,body", [("/v1/completions", P), ("/v1/chat/completions", M)])
def test_continuous_usage_stats_are_on_every_chunk(http, route, body):
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks = _sse_chunks(http, route, {**body, "max_tokens": 3, "ignore_eos": True, "stream": True,
                                       "stream_options": options})
    assert chunks and all("usage" in c and c["usage"]["prompt_tokens"] > 0 for c in chunks), chunks
    completion = [c["usage"]["completion_tokens"] for c in chunks]
    assert completion == sorted(completion) and completion[-1] == 3       # running totals, then the final one
    assert chunks[-1]["choices"] == []


def test_the_chat_role_chunk_comes_with_the_first_token(http):
    options = {"continuous_usage_stats": True}
    chunks = _sse_chunks(http, "/v1/chat/completions", {**M, "stream": True, "stream_options": options})
    first = chunks[0]
    assert first["choices"][0]["delta"]["role"] == "assistant"
    # Sent once the prefill has run: by then the first token exists, and the usage says so.
    assert first["usage"]["completion_tokens"] >= 1


# -- header abuse: raw sockets, since well-behaved clients cannot send it ------------------------------

def _raw(http_server, payload: bytes, read_timeout: float) -> tuple[bytes, float]:
    """Sends payload, returns (everything read until the server closes, seconds it took)."""
    host, port = "127.0.0.1", http_server.port
    start = time.monotonic()
    with socket.create_connection((host, port), timeout=read_timeout) as sock:
        try:
            sock.sendall(payload)
        except OSError:        # the server may close while we still write: also a refusal
            pass
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    return received, time.monotonic() - start


def test_huge_headers_are_refused_with_431(http_server):
    payload = (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (MAX_HEADER_BYTES * 2) + b"\r\n\r\n")
    received, _ = _raw(http_server, payload, read_timeout=30)
    assert received.startswith(b"HTTP/1.1 431"), received[:100]


def test_too_many_headers_are_refused_with_431(http_server):
    headers = b"".join(b"X-H%d: v\r\n" % i for i in range(5000))
    received, _ = _raw(http_server, b"GET /health HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n", read_timeout=30)
    assert received.startswith(b"HTTP/1.1 431"), received[:100]


def test_a_slowloris_client_is_cut_off(http_server):
    # Headers that never end: the server closes the connection after HEADER_TIMEOUT_S, not never.
    host, port = "127.0.0.1", http_server.port
    start = time.monotonic()
    with socket.create_connection((host, port), timeout=HEADER_TIMEOUT_S * 3) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        closed = False
        while time.monotonic() - start < HEADER_TIMEOUT_S * 3:
            try:
                sock.sendall(b"X-Drip: 1\r\n")     # a header every half second, forever
                if sock.recv(1, socket.MSG_DONTWAIT) == b"":
                    closed = True
                    break
            except BlockingIOError:
                pass
            except OSError:
                closed = True
                break
            time.sleep(0.5)
    elapsed = time.monotonic() - start
    assert closed and HEADER_TIMEOUT_S - 1 <= elapsed <= HEADER_TIMEOUT_S + 10, elapsed
    assert httpx.get(http_server.url + "/health", timeout=30).status_code == 200   # others still served


def test_a_trickled_body_is_a_408():
    class Trickle:   # a request whose body arrives a byte a second
        headers: dict = {}

        async def stream(self):
            for _ in range(100):
                await asyncio.sleep(1)
                yield b"x"

    with pytest.raises(APIError) as raised:
        asyncio.run(read_body_in_time(Trickle(), limit=1 << 20, timeout=0.5))
    assert raised.value.status == 408
