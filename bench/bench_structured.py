"""Structured output's overhead, side by side in one run: the fixed workload unconstrained and with
every request under one JSON schema (output tok/s and their ratio; the issue's target is >= 0.9x),
then time to first token of one request with a fresh schema, the same schema cached, and the
schema's compile time alone.

    .venv/bin/python bench/bench_structured.py --num-prompts 32

Runs on the bundled model (SmolLM2-135M-Instruct); the workload's prompts are token ids, so the
constrained runs generate JSON from them, stopping when the schema is complete or at max_tokens.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

WORKLOAD = Path(__file__).parent / "workloads" / "workload_n128_seed0.json"
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 400},
                                           "confidence": {"type": "number"}},
          "required": ["answer", "confidence"]}


def load_requests(path: Path, num_prompts: int) -> list[dict]:
    data = json.loads(path.read_text())
    requests = data["requests"] if isinstance(data, dict) else data
    return requests[:num_prompts]


def run(llm, requests, params_for) -> tuple[float, list[int]]:
    """Seconds for the whole batch, and each request's number of output tokens."""
    prompts = [{"prompt_token_ids": r["prompt_token_ids"]} for r in requests]
    params = [params_for(r) for r in requests]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - start, [len(o.outputs[0].token_ids) for o in outputs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--workload", type=Path, default=WORKLOAD)
    parser.add_argument("--rounds", type=int, default=3, help="alternations of unconstrained / constrained")
    args = parser.parse_args()

    from pagedcore import LLM, SamplingParams
    from pagedcore.sampling_params import StructuredOutputsParams

    requests = load_requests(args.workload, args.num_prompts)
    llm = LLM()
    constraint = StructuredOutputsParams(json=SCHEMA)

    def constrained(r):
        return SamplingParams(temperature=0, max_tokens=r["max_tokens"], structured_outputs=constraint)

    # A constrained request stops when its JSON is complete, so it emits fewer tokens than its
    # max_tokens. The unconstrained run gets each request's constrained length (ignore_eos), so both
    # runs have the same batch shapes step by step and differ only by the grammar work.
    _, lengths = run(llm, requests, constrained)          # warm-up, and the lengths to match
    for r, n in zip(requests, lengths):
        r["constrained_len"] = max(1, n)

    def plain(r):
        return SamplingParams(temperature=0, max_tokens=r["constrained_len"], ignore_eos=True)

    print(f"{len(requests)} requests of {args.workload.name}, {sum(lengths)} output tokens per run")
    rates = {"unconstrained": [], "json schema": []}
    for round_ in range(args.rounds):
        for name, params_for in (("unconstrained", plain), ("json schema", constrained)):
            seconds, counts = run(llm, requests, params_for)
            tokens = sum(counts)
            rates[name].append(tokens / seconds)
            print(f"round {round_ + 1} {name:>13}: {tokens} output tokens in {seconds:.1f} s = "
                  f"{tokens / seconds:.1f} tok/s", flush=True)
    plain_rate = sum(rates["unconstrained"]) / len(rates["unconstrained"])
    json_rate = sum(rates["json schema"]) / len(rates["json schema"])
    print(f"mean: unconstrained {plain_rate:.1f} tok/s, json schema {json_rate:.1f} tok/s, "
          f"ratio {json_rate / plain_rate:.2f}x (target >= 0.9x)")

    # Time to first token, wall clock of a one-token request (the offline API compiles inside
    # add_request, before the request's arrival time is stamped): a schema never seen, the same
    # schema again (cached), and the compile alone on a new cache entry.
    prompt = [{"prompt_token_ids": requests[0]["prompt_token_ids"]}]
    grammars = llm.llm_engine.grammars
    for label in ("fresh schema", "cached schema"):
        params = SamplingParams(temperature=0, max_tokens=1,
                                structured_outputs=StructuredOutputsParams(json={**SCHEMA, "title": "fresh"}))
        start = time.perf_counter()
        llm.generate(prompt, params, use_tqdm=False)
        print(f"TTFT, {label}: {(time.perf_counter() - start) * 1000:.1f} ms", flush=True)
    start = time.perf_counter()
    grammars.compile(StructuredOutputsParams(json={**SCHEMA, "title": "compile only"}))
    print(f"compile alone (a new schema of the same size): {(time.perf_counter() - start) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
