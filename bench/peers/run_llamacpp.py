"""llama.cpp through llama-cpp-python (its own venv, /tmp/llama-venv) on the Q4_1 GGUF itself, greedy,
single stream: llama.cpp's own weights format is its strength, so it runs the file as shipped.
Decode mode only (the high-level API serves one sequence at a time).
    /tmp/llama-venv/bin/python bench/peers/run_llamacpp.py --mode decode
"""

import time

from common import decode_prompt, default_gguf, emit, load_requests, parser, time_decode


def main():
    p = parser(__doc__)
    args = p.parse_args()
    if args.mode != "decode":
        raise SystemExit("run_llamacpp.py measures single-stream decode only (--mode decode)")
    t0 = time.perf_counter()
    from llama_cpp import Llama
    llm = Llama(model_path=args.model or default_gguf(), n_threads=args.threads, n_threads_batch=args.threads,
                n_ctx=max(2048, args.decode_prompt_len + args.decode_tokens + 8), n_batch=512, verbose=False)
    startup = time.perf_counter() - t0
    prompt = decode_prompt(load_requests(args.workload, args.limit), args.decode_prompt_len)

    def generate_k(k):
        llm.reset()                                  # no KV reuse from the previous run: prompt prefilled anew
        for i, _ in enumerate(llm.generate(prompt, top_k=1, temp=0.0, reset=True)):
            if i + 1 == k:                           # generate() never stops at EOS by itself: ignore_eos
                break
    result = {"engine": "llama.cpp", "dtype": "q4_1", "mode": "decode", "startup_seconds": startup}
    result.update(time_decode(generate_k, args.decode_tokens, args.decode_repeats))
    t0 = time.perf_counter()
    llm.reset()
    llm.eval(prompt)
    result["prompt_tok_per_s"] = len(prompt) / (time.perf_counter() - t0)
    emit(result)


if __name__ == "__main__":
    main()
