"""pagedcore through its offline API, measured as vLLM's runner is: LLM(...) then one generate() of
every request. Runs in pagedcore's venv.  python bench/peers/run_pagedcore.py --mode throughput --dtype bfloat16
"""

import time

from common import decode_prompt, emit, load_requests, parser, time_decode


def main():
    p = parser(__doc__)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    args = p.parse_args()
    t0 = time.perf_counter()
    from pagedcore import LLM, SamplingParams
    llm = LLM(model=args.model, dtype=args.dtype, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, num_threads=args.threads)
    startup = time.perf_counter() - t0
    requests = load_requests(args.workload, args.limit)
    result = {"engine": "pagedcore", "dtype": args.dtype, "mode": args.mode, "startup_seconds": startup}
    if args.mode == "throughput":
        prompts = [{"prompt_token_ids": r["prompt_token_ids"]} for r in requests]
        params = [SamplingParams(temperature=0, max_tokens=r["max_tokens"], ignore_eos=True) for r in requests]
        llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True), use_tqdm=False)
        t0 = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - t0
        num_out = sum(len(o.outputs[0].token_ids) for o in outputs)
        result.update(wall_seconds=wall, num_requests=len(requests), output_tokens=num_out,
                      output_tok_per_s=num_out / wall,
                      sample_tokens=[list(o.outputs[0].token_ids[:16]) for o in outputs[:4]])
    else:
        prompt = {"prompt_token_ids": decode_prompt(requests, args.decode_prompt_len)}
        def generate_k(k):
            llm.generate([prompt], SamplingParams(temperature=0, max_tokens=k, ignore_eos=True), use_tqdm=False)
        result.update(time_decode(generate_k, args.decode_tokens, args.decode_repeats))
    emit(result)


if __name__ == "__main__":
    main()
