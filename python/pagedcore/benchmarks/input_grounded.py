"""The input-grounded workload: edits and summaries that copy spans of a long prompt.

Where speculative decoding by prompt lookup pays: the answer repeats the document it was given.
Built once with the default model (`python -m pagedcore.benchmarks.input_grounded OUT.json`) from
text every machine has (Python's own docstrings), stored as token ids in bench/workloads/
input_grounded.json with each request's greedy answer, whose length becomes its max_tokens (so runs
with and without speculation generate exactly the same tokens).
"""

from __future__ import annotations

import argparse
import hashlib
import json

TASKS = (
    "Repeat the text below exactly, word for word, but write every occurrence of the word \"the\" in capital "
    "letters.",
    "Rewrite the text below with each sentence on its own line, keeping the wording unchanged.",
    "Summarize the text below in a few sentences, quoting its most important sentences verbatim.",
    "Copy the text below, correcting any spelling mistakes, and change nothing else.",
)
MODULES = ("argparse", "json", "collections", "functools", "itertools", "pathlib", "subprocess", "logging",
           "dataclasses", "contextlib", "textwrap", "heapq", "bisect", "random", "shutil", "tempfile")
WORKLOAD_PATH = "bench/workloads/input_grounded.json"


def documents(num: int, max_chars: int = 1400) -> list[tuple[str, str]]:
    """(source, text) pairs: the first paragraphs of stdlib module docstrings (fixed by the Python version)."""
    import importlib

    out = []
    for name in MODULES:
        doc = (importlib.import_module(name).__doc__ or "").strip()
        if len(doc) < 400:
            continue
        cut = doc[:max_chars]
        out.append((f"{name}.__doc__", cut[:cut.rfind(".") + 1] if "." in cut[200:] else cut))
        if len(out) == num:
            break
    return out


def build(num_requests: int = 16, max_tokens: int = 192, dtype: str = "float32") -> dict:
    from pagedcore import LLM, SamplingParams

    llm = LLM(dtype=dtype, kv_cache_commit="startup")
    tok = llm.get_tokenizer()
    docs = documents(num_requests)
    prompts, sources = [], []
    for i in range(num_requests):
        source, text = docs[i % len(docs)]
        task = TASKS[(i + i // len(docs)) % len(TASKS)]
        messages = [{"role": "user", "content": f"{task}\n\n{text}"}]
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompts.append([int(t) for t in tok.encode(text, add_special_tokens=False)])
        sources.append({"document": source, "task": task})
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)
    requests = []
    for i, (p, o) in enumerate(zip(prompts, outs)):
        answer = o.outputs[0].token_ids
        requests.append({"id": i, "prompt_token_ids": p, "max_tokens": max(16, len(answer)), "ignore_eos": True,
                         "reference_output_token_ids": answer, **sources[i]})
    blob = json.dumps([r["prompt_token_ids"] for r in requests]).encode()
    meta = {"n": num_requests, "kind": "input-grounded", "model": "default (SmolLM2-135M-Instruct Q4_1 GGUF)",
            "dtype": dtype, "generation": f"greedy, max_tokens {max_tokens}, stops at EOS",
            "prompt_sha256": hashlib.sha256(blob).hexdigest()}
    return {"meta": meta, "requests": requests}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("output", nargs="?", default=WORKLOAD_PATH)
    p.add_argument("--num-requests", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=192)
    args = p.parse_args()
    data = build(args.num_requests, args.max_tokens)
    with open(args.output, "w") as f:
        json.dump(data, f)
    print(f"wrote {args.output}: {len(data['requests'])} requests")


if __name__ == "__main__":
    main()
