"""`pagedcore bench ...` end to end with tiny settings: each command runs and prints its fields.

No timing is asserted (CI machines are shared); only that the commands run, count right and report.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from pagedcore.cli import main

TINY = ["--num-threads", "1", "--kv-cache-memory", "16MiB", "--max-model-len", "256"]


def test_throughput_synthetic(tiny_model_folder, tmp_path, capsys):
    out_json = tmp_path / "tp.json"
    rc = main(["--log-level", "WARNING", "bench", "throughput", "--model", tiny_model_folder, "--num-prompts", "6",
               "--max-prompt-len", "40", "--max-output-len", "5", "--min-output-len", "3", "--gemm-gflops", "50",
               "--profile-ops", "--output-json", str(out_json), *TINY])
    text = capsys.readouterr().out
    assert rc == 0
    for field in ("requests/s", "output tok/s", "total tok/s", "wall:", "peak RSS", "KV cache:",
                  "Per-step breakdown", "model forward", "sampling", "scheduler", "attention kernels", "Roofline",
                  "x the floor", "by step size"):
        assert field in text, field
    result = json.loads(out_json.read_text())
    assert result["num_requests"] == 6 and result["workload"]["kind"] == "synthetic"
    assert result["output_tokens"] == result["workload"]["output_tokens"]     # ignore_eos: exactly max_tokens
    assert result["breakdown"]["num_steps"] > 0 and result["linear_seconds"] > 0
    assert result["roofline"]["gemm_gflops"] == 50


def test_throughput_workload_file_shared_prefix_and_long_prompt(tiny_model_folder, tmp_path, capsys):
    from pagedcore.benchmarks import workloads
    path = tmp_path / "w.json"
    workloads.to_file(workloads.synthetic(3, 512, seed=0, max_prompt=30, max_output=4, min_output=2), str(path))
    common = ["--log-level", "WARNING", "bench", "throughput", "--model", tiny_model_folder, "--no-roofline", *TINY]
    assert main(common + ["--workload-file", str(path)]) == 0
    assert "workload: file" in capsys.readouterr().out
    assert main(common + ["--workload", str(path)]) == 0            # a .json path works as the kind too
    assert "workload: file" in capsys.readouterr().out
    # A 64-token budget prefills one prompt per step, so the later ones find the 48-token prefix cached
    # (3 full blocks of 16); all three in one step would find nothing yet.
    assert main(common + ["--workload", "shared-prefix", "--num-prompts", "3", "--prefix-len", "48",
                          "--max-output-len", "16", "--max-num-batched-tokens", "64", "--block-size", "16"]) == 0
    text = capsys.readouterr().out
    hits = int(text.split("prefix-hit tokens: ")[1].split()[0])
    assert hits >= 2 * 48
    # 100-token prompts under a 32-token budget: prefilled in chunks.
    assert main(common + ["--workload", "long-prompt", "--num-prompts", "2", "--max-prompt-len", "100",
                          "--max-output-len", "3", "--max-num-batched-tokens", "32"]) == 0
    assert "200 prompt + 6 output tokens" in capsys.readouterr().out


def test_latency(tiny_model_folder, capsys):
    rc = main(["--log-level", "WARNING", "bench", "latency", "--model", tiny_model_folder, "--input-len", "20",
               "--output-len", "4", "--num-iters", "1", "--batch-sizes", "1", "4", "--decode-steps", "3",
               "--bandwidth-gbps", "10", "--gemm-gflops", "50", *TINY])
    text = capsys.readouterr().out
    assert rc == 0
    for field in ("TTFT", "TPOT", "E2E", "per-step breakdown", "Decode step", "outside fwd", "floor tok/s"):
        assert field in text, field
    rows = [line.split() for line in text.splitlines() if line.strip().startswith(("1 ", "4 "))]
    assert [r[0] for r in rows] == ["1", "4"]


def test_roofline_command(tiny_model_folder, capsys):
    rc = main(["bench", "roofline", "--model", tiny_model_folder, "--rows", "1", "--num-prompts", "4",
               "--bandwidth-mib", "8", "--min-time", "0.01", "--measured", "x=float32:1.0"])
    text = capsys.readouterr().out
    assert rc == 0
    for field in ("GEMM float32", "GEMM bfloat16", "memory: copy", "TFLOP", "workload floor", "x the float32 floor"):
        assert field in text, field


# -- bench serve against a stand-in OpenAI server -------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fake_openai_server():
    """Streams max_tokens one-word chunks, then usage and [DONE]; a prompt starting with token 0 gets a 400."""
    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI()

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}

    @app.post("/v1/completions")
    async def completions(body: dict):
        if body["prompt"][0] == 0:
            return JSONResponse({"error": {"message": "bad prompt"}}, status_code=400)

        async def stream():
            for i in range(body["max_tokens"]):
                yield f'data: {json.dumps({"choices": [{"index": 0, "text": f" w{i}"}]})}\n\n'
            usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": body["max_tokens"]}
            yield f'data: {json.dumps({"choices": [], "usage": usage})}\n\n'
            yield "data: [DONE]\n\n"
        return StreamingResponse(stream(), media_type="text/event-stream")

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def test_serve_against_an_openai_compatible_server(fake_openai_server, tmp_path, capsys):
    from pagedcore.benchmarks import workloads
    path = tmp_path / "w.json"
    reqs = workloads.synthetic(5, 512, seed=0, max_prompt=20, min_output=2, max_output=5)
    reqs[4].prompt_token_ids[0] = 0                      # the stand-in rejects this one
    workloads.to_file(reqs, str(path))
    out_json = tmp_path / "serve.json"
    rc = main(["bench", "serve", "--base-url", fake_openai_server, "--workload-file", str(path),
               "--request-rate", "50", "inf", "--concurrency", "3", "--output-json", str(out_json),
               "--plot-dir", str(tmp_path / "plots")])
    text = capsys.readouterr().out
    assert rc == 0
    for field in ("TTFT", "TPOT", "ITL", "E2E", "p50", "p90", "p99", "req/s", "output tok/s", "error x1: HTTP 400"):
        assert field in text, field
    result = json.loads(out_json.read_text())
    assert result["model"] == "fake-model" and len(result["runs"]) == 2
    run = result["runs"][0]
    assert (run["completed"], run["failed"]) == (4, 1)
    assert run["output_tokens"] == sum(r.max_tokens for r in reqs[:4])
    ok = [r for r in run["requests"] if r["success"]]
    assert all(len(r["itl"]) == r["output_tokens"] - 1 for r in ok)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "plots skipped" in text
    else:
        assert (tmp_path / "plots" / "latency_distribution.png").exists()
        assert (tmp_path / "plots" / "throughput_vs_load.png").exists()
