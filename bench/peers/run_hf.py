"""HF transformers generate() as a user without an engine would run it: static batches of --batch-size
requests in workload order, left padding, greedy; a batch runs until its longest request is done
(min_new_tokens = max_new_tokens keeps EOS from ending it early; that is ignore_eos). Output tokens
counted are each request's own max_tokens, so the figure is comparable with the engines'.
Runs in pagedcore's venv (transformers, gguf, accelerate).
"""

import time

from common import decode_prompt, default_gguf, emit, load_requests, parser, time_decode


def main():
    p = parser(__doc__)
    p.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args()
    t0 = time.perf_counter()
    import os

    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(args.threads)
    path = args.model or default_gguf()
    if path.endswith(".gguf"):
        folder, name = os.path.split(path)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model = model.to(getattr(torch, args.dtype)).eval()
    pad = model.config.eos_token_id if isinstance(model.config.eos_token_id, int) else 0
    startup = time.perf_counter() - t0
    requests = load_requests(args.workload, args.limit)
    result = {"engine": "hf", "dtype": args.dtype, "mode": args.mode, "startup_seconds": startup,
              "batch_size": args.batch_size}

    def run_batch(prompts, new_tokens):
        width = max(len(x) for x in prompts)
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, x in enumerate(prompts):              # left padding: every prompt ends at the last column
            ids[i, width - len(x):] = torch.tensor(x)
            mask[i, width - len(x):] = 1
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=False, pad_token_id=pad)
        return out[:, width:]

    if args.mode == "throughput":
        run_batch([requests[0]["prompt_token_ids"][:16]], 2)      # warm-up
        samples = []
        t0 = time.perf_counter()
        for start in range(0, len(requests), args.batch_size):
            batch = requests[start:start + args.batch_size]
            out = run_batch([r["prompt_token_ids"] for r in batch], max(r["max_tokens"] for r in batch))
            if not samples:
                samples = [out[i, :16].tolist() for i in range(min(4, len(batch)))]
        wall = time.perf_counter() - t0
        num_out = sum(r["max_tokens"] for r in requests)
        result.update(wall_seconds=wall, num_requests=len(requests), output_tokens=num_out,
                      output_tok_per_s=num_out / wall, sample_tokens=samples)
    else:
        prompt = decode_prompt(requests, args.decode_prompt_len)
        result.update(time_decode(lambda k: run_batch([prompt], k), args.decode_tokens, args.decode_repeats))
    emit(result)


if __name__ == "__main__":
    main()
