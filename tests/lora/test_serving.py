"""`pagedcore serve --enable-lora --lora-modules ...` over the wire: OpenAI `model` = adapter name,
TGIS `adapter_id`, /v1/models with parents, runtime load/unload behind VLLM_ALLOW_RUNTIME_LORA_UPDATING,
unknown adapters (404 / NOT_FOUND naming the loaded ones) and the lora_requests_info gauge."""

from __future__ import annotations

import grpc
import httpx
import pytest

from pagedcore.serving.grpc.stubs import generation_pb2 as pb
from pagedcore.serving.grpc.stubs import generation_pb2_grpc as pb_grpc
from tests.engine.conftest import hf_greedy
from tests.serving.http_helpers import ServerProcess, free_port

PROMPT = [1, 40, 77, 12, 300, 5, 91, 23, 8]


@pytest.fixture(scope="module")
def server(tiny_base, adapters):
    _, folder = tiny_base
    (s0, f0, _), (s1, f1, _) = adapters[0], adapters[1]
    grpc_port = free_port()
    proc = ServerProcess("--model", folder, "--served-model-name", "base", "--max-model-len", "256", "--enable-lora",
                         "--max-loras", "2", "--max-cpu-loras", "3", "--lora-modules", f"{s0.name}={f0}",
                         f'{{"name": "{s1.name}", "path": "{f1}"}}', "--grpc-port", str(grpc_port),
                         env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true"})
    proc.grpc_port = grpc_port
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def complete(server, model, max_tokens=6):
    return httpx.post(server.url + "/v1/completions", timeout=120, json={
        "model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})


def test_models_list_adapters_with_parent(server, adapters):
    cards = {c["id"]: c for c in httpx.get(server.url + "/v1/models", timeout=30).json()["data"]}
    assert cards["base"]["parent"] is None
    for spec, folder, _ in adapters[:2]:
        assert cards[spec.name]["parent"] == "base" and cards[spec.name]["root"] == folder
    assert httpx.get(server.url + f"/v1/models/{adapters[0][0].name}", timeout=30).json()["parent"] == "base"


def test_model_name_selects_the_adapter(server, tiny_base, adapters):
    hf_base, _ = tiny_base
    bodies = {name: complete(server, name).json() for name in ("base", adapters[0][0].name, adapters[1][0].name)}
    got = {name: body["choices"][0]["text"] for name, body in bodies.items()}
    assert {name: body["model"] for name, body in bodies.items()} == {name: name for name in bodies}  # echoed
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_base[1])
    want = {"base": hf_greedy(hf_base, PROMPT, 6)}
    for spec, _, merged in adapters[:2]:
        want[spec.name] = hf_greedy(merged, PROMPT, 6)
    for name, tokens in want.items():
        assert got[name] == tokenizer.decode(tokens), name
    assert len(set(got.values())) == 3, "each adapter should answer differently"


def test_unknown_adapter_is_404_naming_the_loaded_ones(server, adapters):
    r = complete(server, "no-such-adapter")
    assert r.status_code == 404
    message = r.json()["error"]["message"]
    assert "no-such-adapter" in message and adapters[0][0].name in message and adapters[1][0].name in message


def test_runtime_load_and_unload(server, adapters):
    spec, folder, merged = adapters[2]
    url = server.url + "/v1/load_lora_adapter"
    bad = httpx.post(url, json={"lora_name": "broken", "lora_path": "/nonexistent"}, timeout=60)
    assert bad.status_code == 400 and "no such folder" in bad.json()["error"]["message"]
    ok = httpx.post(url, json={"lora_name": spec.name, "lora_path": folder}, timeout=60)
    assert ok.status_code == 200, ok.text
    again = httpx.post(url, json={"lora_name": spec.name, "lora_path": folder}, timeout=60)
    assert again.status_code == 400
    assert complete(server, spec.name).status_code == 200
    ids = [c["id"] for c in httpx.get(server.url + "/v1/models", timeout=30).json()["data"]]
    assert spec.name in ids
    gone = httpx.post(server.url + "/v1/unload_lora_adapter", json={"lora_name": spec.name}, timeout=60)
    assert gone.status_code == 200, gone.text
    assert complete(server, spec.name).status_code == 404
    missing = httpx.post(server.url + "/v1/unload_lora_adapter", json={"lora_name": spec.name}, timeout=60)
    assert missing.status_code == 404


def test_grpc_adapter_id(server, adapters):
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = pb_grpc.GenerationServiceStub(channel)
        params = pb.Parameters(method=pb.GREEDY, stopping=pb.StoppingCriteria(max_new_tokens=6, min_new_tokens=6))
        text = "The quick brown fox"
        replies = {}
        for adapter in (None, adapters[0][0].name):
            request = pb.BatchedGenerationRequest(requests=[pb.GenerationRequest(text=text)], params=params)
            if adapter:
                request.adapter_id = adapter
            replies[adapter] = stub.Generate(request, timeout=120).responses[0].text
        http = {}
        for model in ("base", adapters[0][0].name):
            http[model] = httpx.post(server.url + "/v1/completions", timeout=120, json={
                "model": model, "prompt": text, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
            ).json()["choices"][0]["text"]
        assert replies[None] == http["base"]
        assert replies[adapters[0][0].name] == http[adapters[0][0].name]
        request = pb.BatchedGenerationRequest(requests=[pb.GenerationRequest(text=text)], params=params,
                                              adapter_id="nope")
        with pytest.raises(grpc.RpcError) as refused:
            stub.Generate(request, timeout=60)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        assert adapters[0][0].name in refused.value.details()


def test_lora_requests_info_metric(server, adapters):
    text = httpx.get(server.url + "/metrics", timeout=30).text
    lines = [line for line in text.splitlines() if line.startswith("pagedcore:lora_requests_info{")]
    assert len(lines) == 1 and 'max_lora="2"' in lines[0]
