"""TP=2 and PP=2 against one process, through the whole engine (LLM) and `pagedcore serve`.

Greedy tokens must be equal (fp32) and the logits of every step within a stated tolerance: an
all-reduce adds the partial sums of a row-parallel layer in another order than one matmul, and
pipeline micro-batches run GEMMs of other shapes, so the last bits may differ; a wrong shard, a
block id meaning different slots on two ranks, or a logits row out of place would not be close.
Prefix caching (shared prompt prefixes), chunked prefill (a small token budget) and preemption (a
small block pool; recompute and swap) are all in play in every run.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagedcore import LLM, SamplingParams
from pagedcore.engine.step_input import StepInput
from tests.engine.conftest import hf_greedy, prompts_with_shared_prefix
from tests.models import tiny_models
from tests.serving.http_helpers import ServerProcess, free_port

from .engine_helpers import TINY_KIND, greedy, wait_gone

LAYOUTS = {"tp2": dict(tensor_parallel_size=2), "pp2": dict(pipeline_parallel_size=2)}
# Every run: prefill chunks of <= 32 tokens, a pool of 14 blocks of 16 tokens (10 requests of up to
# ~110 tokens do not fit: preemption), the shared 40-token prefix cached.
TIGHT = dict(max_model_len=256, max_num_batched_tokens=32, block_size=16, num_gpu_blocks_override=14,
             enable_prefix_caching=True)
PREEMPTION = {"recompute": dict(preemption_mode="recompute"),
              "swap": dict(preemption_mode="swap", swap_space="64MiB")}
# fp32 logits of the parallel run vs one process: |a - b| <= ATOL + RTOL * |b| (see the module docstring).
RTOL, ATOL = 1e-4, 1e-4
MAX_TOKENS = 20


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    hf_model = tiny_models.build_hf_model(TINY_KIND)
    folder = tiny_models.save_hf_folder(hf_model, tmp_path_factory.mktemp("dist_tiny"))
    prompts = prompts_with_shared_prefix(10)
    return folder, prompts, [hf_greedy(hf_model, p, MAX_TOKENS) for p in prompts]


def record_logits(llm: LLM) -> list[np.ndarray]:
    """Every step's logits, as the engine received them from its worker."""
    worker = llm.llm_engine.worker
    steps: list[np.ndarray] = []
    execute = worker.execute_step

    def recording(step: StepInput) -> torch.Tensor:
        logits = execute(step)
        steps.append(logits.clone().numpy())
        return logits

    worker.execute_step = recording
    # Every step must hand its logits to the engine: the one-call greedy path (tokens only) is off.
    worker.execute_fused_step = lambda step, sampling=None, edits=None, raw=None: None
    return steps


def run(llm: LLM, prompts, max_tokens: int = MAX_TOKENS) -> tuple[list[list[int]], list[np.ndarray]]:
    steps = record_logits(llm)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy(max_tokens), use_tqdm=False)
    return [o.outputs[0].token_ids for o in outputs], steps


def assert_logits_close(got: list[np.ndarray], expected: list[np.ndarray]) -> float:
    """Step by step (the same scheduling follows from the same tokens). Returns the largest difference."""
    assert len(got) == len(expected)
    worst = 0.0
    for i, (a, b) in enumerate(zip(got, expected)):
        assert a.shape == b.shape, f"step {i}: logits {a.shape} vs {b.shape}"
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=f"step {i}")
        if a.size:
            worst = max(worst, float(np.abs(a - b).max()))
    return worst


@pytest.mark.parametrize("preemption", list(PREEMPTION))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_tiny_model_equals_one_process_and_hf(tiny, layout, preemption):
    folder, prompts, hf_tokens = tiny
    settings = dict(model=folder, **TIGHT, **PREEMPTION[preemption])
    reference = LLM(**settings)
    ref_tokens, ref_logits = run(reference, prompts)
    assert ref_tokens == hf_tokens
    with LLM(**settings, **LAYOUTS[layout]) as llm:
        pids = llm.llm_engine.worker.pids
        tokens, logits = run(llm, prompts)
        assert tokens == hf_tokens
        assert_logits_close(logits, ref_logits)
        stats = llm.llm_engine.scheduler.stats()
        assert stats.num_preemptions > 0, "the setting was meant to force preemption"
        assert stats.prefix_hit_tokens > 0, "shared prompts should hit the prefix cache"
        assert stats.num_free_blocks == llm.llm_engine.scheduler.config.num_gpu_blocks   # nothing leaked
    assert wait_gone(pids)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_default_model_equals_one_process(layout):
    """SmolLM2-135M (9 query / 3 KV heads: TP=2 splits them 6 + 3) dequantised to fp32."""
    prompts = ["The capital of France is", "Hello, my name is", "def fibonacci(n):",
               "The capital of France is a city where"]   # shares a prefix with the first
    settings = dict(dtype="float32", max_model_len=256, max_num_batched_tokens=16, block_size=16,
                    num_gpu_blocks_override=5, preemption_mode="swap" if layout == "tp2" else "recompute",
                    swap_space="64MiB")
    reference = LLM(**settings)
    tok = reference.get_tokenizer()
    ids = [tok.encode(p) for p in prompts]
    ref_tokens, ref_logits = run(reference, ids, max_tokens=16)
    with LLM(**settings, **LAYOUTS[layout]) as llm:
        tokens, logits = run(llm, ids, max_tokens=16)
        assert tokens == ref_tokens
        assert_logits_close(logits, ref_logits)
        assert llm.llm_engine.scheduler.stats().num_preemptions > 0


SERVE_LAYOUTS = {"tp2": ("--tensor-parallel-size", "2", "tp 2 x pp 1"),
                 "pp2": ("--pipeline-parallel-size", "2", "tp 1 x pp 2")}


@pytest.fixture(scope="module", params=list(SERVE_LAYOUTS))
def tp2_server(request):
    """`pagedcore serve` with TP=2, then with PP=2 (the tests using it run once per layout)."""
    flag, size, started = SERVE_LAYOUTS[request.param]
    grpc_port = free_port()
    server = ServerProcess(flag, size, "--dtype", "float32", "--grpc-port", str(grpc_port))
    server.grpc_port = grpc_port
    server.started_line = f"started 2 rank(s) ({started})"
    try:
        server.wait_ready()
        yield server
    finally:
        assert server.stop() == 0


@pytest.fixture(scope="module")
def one_process_texts():
    from tests.serving.http_helpers import MAX_MODEL_LEN

    llm = LLM(dtype="float32", kv_cache_memory="256MiB", max_model_len=MAX_MODEL_LEN)
    outputs = llm.generate(["The capital of France is", "Hello, my name is"],
                           SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    return [o.outputs[0].text for o in outputs]


def test_serve_tp2_openai_completion_equals_one_process(tp2_server, one_process_texts):
    import openai

    client = openai.OpenAI(base_url=tp2_server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    try:
        for prompt, expected in zip(["The capital of France is", "Hello, my name is"], one_process_texts):
            reply = client.completions.create(model=client.models.list().data[0].id, prompt=prompt, max_tokens=8,
                                              temperature=0)
            assert reply.choices[0].text == expected
    finally:
        client.close()
    assert tp2_server.started_line in tp2_server.log()


def test_serve_tp2_grpc_generate_equals_one_process(tp2_server, one_process_texts):
    import grpc

    from pagedcore.serving.grpc.stubs import generation_pb2 as pb
    from pagedcore.serving.grpc.stubs import generation_pb2_grpc as pb_grpc

    params = pb.Parameters(method=pb.GREEDY, stopping=pb.StoppingCriteria(max_new_tokens=8))
    request = pb.BatchedGenerationRequest(
        requests=[pb.GenerationRequest(text=t) for t in ["The capital of France is", "Hello, my name is"]],
        params=params)
    with grpc.insecure_channel(f"127.0.0.1:{tp2_server.grpc_port}") as channel:
        reply = pb_grpc.GenerationServiceStub(channel).Generate(request, timeout=300)
    assert [r.text for r in reply.responses] == one_process_texts


def test_bench_latency_compares_tp2_with_one_process(tiny):
    """`pagedcore bench latency --tensor-parallel-size 2` runs both engines and reports both rates."""
    import subprocess
    import sys

    folder, _, _ = tiny
    result = subprocess.run([sys.executable, "-m", "pagedcore.cli", "bench", "latency", "--model", folder,
                             "--tensor-parallel-size", "2", "--input-len", "8", "--output-len", "6", "--num-iters", "1",
                             "--max-model-len", "64", "--block-size", "16", "--num-gpu-blocks-override", "16"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "one process    decode" in result.stdout and "tp 2 x pp 1    decode" in result.stdout, result.stdout
    assert "machine:" in result.stdout and "load average" in result.stdout   # the CPU and load beside the figure


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_draft_rows_and_prompt_logprob_rows_come_back_in_place(tiny, layout):
    """Speculative decoding (k + 1 logits rows per drafting sample) and prompt logprobs (rows after the
    sampled ones): each row must come back where logits_indices put it, across shards and micro-batches."""
    folder, prompts, _ = tiny
    # Repeating prompts, so the n-gram proposer finds matches and drafts.
    repeating = [(p[:12] * 4)[:40] for p in prompts[:6]]
    settings = dict(model=folder, max_model_len=256, max_num_batched_tokens=64,
                    speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3})
    params = greedy(12, prompt_logprobs=2)   # sampled logprobs would turn speculation off
    reference = LLM(**settings)
    ref_steps = record_logits(reference)
    expected = reference.generate([{"prompt_token_ids": p} for p in repeating], params, use_tqdm=False)
    with LLM(**settings, **LAYOUTS[layout]) as llm:
        steps = record_logits(llm)
        got = llm.generate([{"prompt_token_ids": p} for p in repeating], params, use_tqdm=False)
        assert llm.llm_engine.speculator.stats.num_draft_tokens > 0, "no drafts: the test did not exercise k + 1 rows"
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in expected]
    assert_logits_close(steps, ref_steps)
    for a, b in zip(got, expected):   # prompt logprobs: the extra rows, per prompt position
        assert len(a.prompt_logprobs) == len(b.prompt_logprobs)
        for pa, pb in zip(a.prompt_logprobs, b.prompt_logprobs):
            if pb is None:
                assert pa is None
                continue
            assert pa.keys() == pb.keys()
            for token in pb:
                assert pa[token].logprob == pytest.approx(pb[token].logprob, abs=1e-4)
