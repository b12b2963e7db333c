"""Fixtures of the HTTP serving tests: a real `pagedcore serve` in a subprocess (once per session),
the official openai client on it, and the offline LLM to hold the server's text to.

The default GGUF model, a small KV cache and max_model_len, gRPC off (its tests start their own).
Generation on a shared 2-core machine can take a second per token: tests keep max_tokens tiny.
"""

from __future__ import annotations

import pytest

from tests.serving.http_helpers import MAX_BODY_BYTES, MAX_MODEL_LEN, SERVED_NAMES, ServerProcess


@pytest.fixture(scope="session")
def http_server():
    server = ServerProcess("--served-model-name", *SERVED_NAMES, "--max-request-body-bytes", str(MAX_BODY_BYTES))
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def openai_client(http_server):
    import openai

    client = openai.OpenAI(base_url=http_server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    yield client
    client.close()


@pytest.fixture(scope="session")
def offline_llm():
    from pagedcore import LLM

    return LLM(kv_cache_memory="256MiB", max_model_len=MAX_MODEL_LEN)
