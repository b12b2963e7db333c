"""llama.cpp's perplexity (through llama-cpp-python, its own venv) on token windows that
`pagedcore bench perplexity` writes: the same token ids, each window evaluated on its own from an
empty cache, only its second half scored (llama.cpp's perplexity tool's rule), PPL = exp(mean NLL).
Prints one JSON line {"ppl": ..., "tokens": ...}.
    /tmp/llama-venv/bin/python bench/peers/perplexity_llamacpp.py --model FILE.gguf --tokens windows.json
(pagedcore bench perplexity --llamacpp-python /tmp/llama-venv/bin/python runs it and prints both.)
"""

import argparse
import json
import os

import numpy as np


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="the .gguf file")
    p.add_argument("--tokens", required=True, help='JSON {"ctx": C, "windows": [[ids of C tokens], ...]}')
    p.add_argument("--threads", type=int, default=os.cpu_count())
    args = p.parse_args()
    with open(args.tokens) as f:
        spec = json.load(f)
    ctx, windows = spec["ctx"], spec["windows"]
    from llama_cpp import Llama

    # logits_all: a row of logits per evaluated position (llm.scores), as the perplexity tool reads.
    llm = Llama(model_path=args.model, n_ctx=ctx, n_batch=ctx, n_ubatch=ctx, logits_all=True,
                n_threads=args.threads, n_threads_batch=args.threads, verbose=False)
    total, count = 0.0, 0
    for window in windows:
        llm.reset()  # an empty KV cache: each window on its own
        llm.eval(window)
        logits = np.asarray(llm.scores[:len(window)], dtype=np.float64)  # [len(window), vocab]
        top = logits.max(-1, keepdims=True)
        log_norm = top[:, 0] + np.log(np.exp(logits - top).sum(-1))  # [len(window)]
        for position in range(len(window) // 2, len(window)):  # token p is predicted by row p - 1
            total -= logits[position - 1, window[position]] - log_norm[position - 1]
            count += 1
    print(json.dumps({"ppl": float(np.exp(total / count)), "tokens": count, "engine": "llama.cpp"}))


if __name__ == "__main__":
    main()
