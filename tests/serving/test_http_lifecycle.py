"""A server of its own for what changes its state: API keys (flag, commas, environment), the bounded
queue (429), and the SIGTERM drain (in-flight stream completes, new work 503, exit code 0).
The tests run in file order; the last one shuts the server down."""

from __future__ import annotations

import json
import signal
import threading

import httpx
import pytest

from tests.serving.http_helpers import ServerProcess, metric, wait_until

KEYS = ["key-one", "key-two", "key-three", "key-four", "key-env"]


@pytest.fixture(scope="module")
def server():
    # One running sequence and one waiting place: a third request is refused.
    # Every way vLLM's users write several keys: commas, several values, the flag repeated, the environment.
    s = ServerProcess("--api-key", "key-one,key-two", "key-three", "--api-key", "key-four",
                      "--max-num-seqs", "1", "--max-queued-requests", "1",
                      "--shutdown-timeout", "120", env={"PAGEDCORE_API_KEY": "key-env"})
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


def auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def test_health_is_503_while_the_model_loads(server):
    # The listener comes up before the model: anything /health said before 200 was "loading".
    assert server.health_seen[-1] == 200
    assert set(server.health_seen[:-1]) <= {503}


@pytest.mark.parametrize("method,path", [("GET", "/v1/models"), ("POST", "/v1/completions"),
                                         ("POST", "/v1/chat/completions"), ("POST", "/tokenize"),
                                         ("POST", "/detokenize")])
def test_inference_routes_need_a_key(server, method, path):
    for headers in ({}, auth("wrong"), {"Authorization": "key-one"}):
        response = httpx.request(method, server.url + path, headers=headers, json={})
        assert response.status_code == 401, response.text
        assert response.json()["error"]["type"] == "authentication_error"


def test_every_key_works_and_probes_stay_open(server):
    for key in KEYS:
        assert httpx.get(server.url + "/v1/models", headers=auth(key)).status_code == 200
    for path in ("/health", "/metrics", "/version"):
        assert httpx.get(server.url + path).status_code == 200


def _start_stream(client: httpx.Client, url: str, prompt: str, max_tokens: int, events: list[str],
                  first: threading.Event, done: threading.Event) -> threading.Thread:
    """Streams a completion on a thread, recording its SSE data lines."""
    def run():
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
        try:
            with client.stream("POST", url + "/v1/completions", json=body, headers=auth("key-one")) as r:
                events.append(f"status {r.status_code}")
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
                        first.set()
        finally:
            first.set()
            done.set()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _texts(events: list[str]) -> tuple[str, str | None]:
    chunks = [json.loads(e) for e in events if e.startswith("{")]
    return "".join(c["choices"][0]["text"] for c in chunks), chunks[-1]["choices"][0]["finish_reason"]


def test_a_full_queue_answers_429(server):
    with httpx.Client(timeout=300) as client:
        running, waiting = ([], threading.Event(), threading.Event()), ([], threading.Event(), threading.Event())
        # Long enough to still be running while the second request queues, the /metrics poll sees it
        # and the third is refused, even on a loaded 2-core machine (16 tokens raced: about 0.2 s).
        threads = [_start_stream(client, server.url, "Count to ten:", 400, *running)]
        assert running[1].wait(120) and running[0][0] == "status 200"   # running: the only sequence
        threads.append(_start_stream(client, server.url, "Hello", 1, *waiting))
        # Queued in the one waiting place (its response starts with its first token, so watch /metrics).
        assert wait_until(lambda: metric(server.url, "pagedcore:num_requests_waiting") == 1, timeout=120,
                          interval=0.05)
        refused = client.post(server.url + "/v1/completions", headers=auth("key-one"),
                              json={"prompt": "Hi", "max_tokens": 1})
        assert refused.status_code == 429, refused.text
        assert refused.headers["Retry-After"] == "1"
        error = refused.json()["error"]
        assert "--max-queued-requests" in error["message"] and "retry after 1 s" in error["message"]
        assert error["type"] == "rate_limit_error"
        for t in threads:
            t.join(300)
        assert _texts(running[0])[1] == "length" and _texts(waiting[0])[1] == "length"
        assert running[0][-1] == waiting[0][-1] == "[DONE]"


def test_sigterm_drains_then_exits_0(server):
    with httpx.Client(timeout=300) as client:
        events, first, done = [], threading.Event(), threading.Event()
        # Long enough that the server is still draining while we probe it, even with fast kernels.
        thread = _start_stream(client, server.url, "Count to ten:", 200, events, first, done)
        assert first.wait(120) and events[0] == "status 200"
        server.proc.send_signal(signal.SIGTERM)
        # Draining: probes and new work are turned away while the stream carries on.
        assert wait_for_status(client, server.url + "/health", 503)
        late = client.post(server.url + "/v1/completions", headers=auth("key-one"), json={"prompt": "Hi"})
        assert late.status_code == 503 and "shutting down" in late.json()["error"]["message"]
        thread.join(300)
        text, finish = _texts(events)
        assert finish == "length" and events[-1] == "[DONE]" and text
    assert server.proc.wait(timeout=120) == 0, server.log()
    assert "shut down cleanly" in server.log()


def wait_for_status(client: httpx.Client, url: str, status: int, timeout: float = 30.0) -> bool:
    stop = threading.Event()
    for _ in range(int(timeout / 0.1)):
        if client.get(url).status_code == status:
            return True
        stop.wait(0.1)
    return False
