"""Where a step's time goes, on the machine at hand: the fixed workload through LLMEngine with timers
around every op family, summed over the run and split by step kind.

    .venv/bin/python bench/profile_step.py --dtype bfloat16                    # the whole workload
    .venv/bin/python bench/profile_step.py --dtype float32 --num-prompts 32    # its first 32 requests
    .venv/bin/python bench/profile_step.py --dtype bfloat16 --torch-profile    # + torch.profiler, one big step
    .venv/bin/python bench/profile_step.py --dtype float32 --prefill-ab torch onednn_packed   # GEMM A/B

Buckets (seconds over the run, share of the wall):
  linears        each Linear call, by layer kind (qkv, o_proj, gate_up+SwiGLU, down) and row count,
                 with its GFLOP/s; steps of at most max_rows tokens run the C++ decoder stack, whose
                 own op timers (DecoderStack profiling) fill the same kinds
  lm_head        compute_logits (sampled rows only)
  attention      paged_attention + reshape_and_cache, split by steps with prefill tokens / decode only
  norms+rotary   fused add+RMSNorm and RoPE calls (and the stack's norm/rope timers)
  sampler        the engine's sample phase;  scheduler: schedule + update/outputs phases
  python glue    the model forward minus every op above (embedding, views, residual adds, dispatch),
                 plus the worker's input preparation
  idle threads   wall x threads - process CPU time: time the threads did not run (waiting on the
                 OS on a shared machine; GNU OpenMP spin-waits count as busy, so barrier waits hide
                 in the ops)
The timers cost ~1-2 us per call (~300 calls per large step): a few % on small steps; headline
throughput comes from `pagedcore bench throughput`, not from here.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import sys
import time

import torch

ROW_BUCKETS = ((8, "1-8"), (64, "9-64"), (128, "65-128"), (512, "129-512"), (None, ">512"))
KINDS = {"qkv_proj": "qkv", "o_proj": "o_proj", "gate_up_proj": "gate_up", "down_proj": "down"}
STACK_OPS = {"qkv": "qkv", "o_proj": "o_proj", "gate_up": "gate_up", "down": "down", "attention": "attention",
             "cache_write": "attention", "norms": "norms+rotary", "rope": "norms+rotary"}


def bucket(rows: int) -> str:
    for bound, name in ROW_BUCKETS:
        if bound is None or rows <= bound:
            return name
    return ROW_BUCKETS[-1][1]


class Profiler:
    """Timers around the model's op families; .acc holds seconds, .linear_calls per (kind, bucket)."""

    def __init__(self, engine):
        self.engine = engine
        self.model = engine.view.model
        self.acc = collections.defaultdict(float)
        self.step_acc = collections.defaultdict(float)
        self.linear = collections.defaultdict(lambda: [0.0, 0, 0.0])  # (kind, bucket) -> [s, calls, flop]
        self.steps = []
        self._undo = []

    def _wrap(self, owner, name, key, flop_of=None):
        original = getattr(owner, name)
        acc = self.step_acc

        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                acc[key] += time.perf_counter() - t0
        setattr(owner, name, wrapper)
        self._undo.append(lambda: setattr(owner, name, original) if not isinstance(owner, torch.nn.Module)
                          else owner.__dict__.pop(name, None))

    def _wrap_linear(self, module, kind, method_name):
        original = getattr(module, method_name)
        table = self.linear
        acc = self.step_acc
        n_flop = 2 * module.in_features * module.out_features

        def wrapper(x, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(x, *args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                rows = x.numel() // x.shape[-1]
                cell = table[(kind, bucket(rows))]
                cell[0] += dt
                cell[1] += 1
                cell[2] += n_flop * rows
                acc["linears"] += dt
        setattr(module, method_name, wrapper)
        self._undo.append(lambda: module.__dict__.pop(method_name, None))

    def __enter__(self):
        from pagedcore.layers.linear import Linear
        from pagedcore.ops import attention as attn_ops
        from pagedcore.ops import elementwise

        for name, module in self.model.named_modules():
            leaf = name.rsplit(".", 1)[-1]
            if isinstance(module, Linear) and leaf in KINDS:
                self._wrap_linear(module, KINDS[leaf], "forward_silu_mul" if leaf == "gate_up_proj" else "forward")
        for fn in ("paged_attention", "reshape_and_cache"):
            self._wrap(attn_ops, fn, "attention")
        for fn in ("rms_norm", "rotary_embedding"):
            self._wrap(elementwise, fn, "norms+rotary")
        self._wrap(self.model, "compute_logits", "lm_head")
        self._wrap(self.model, "forward", "model_forward")
        stack = self.model.model._decoder_stack()
        self.stack = stack
        if stack is not None:
            stack.set_profiling(True)
            stack.profile(reset=True)
        self.engine.view.add_step_listener(self._on_step)
        return self

    def __exit__(self, *exc):
        self.engine.view.remove_step_listener(self._on_step)
        for undo in reversed(self._undo):
            undo()
        if self.stack is not None:
            self.stack.set_profiling(False)

    def _on_step(self, _out, _result, timing):
        rec = dict(self.step_acc)
        self.step_acc.clear()
        if self.stack is not None:
            ops = self.stack.profile(reset=True)
            rows = timing["num_tokens"]
            for op, seconds in ops.items():
                key = STACK_OPS.get(op, "stack_other")
                rec[key] = rec.get(key, 0.0) + seconds
                if key in KINDS.values():
                    cell = self.linear[(key, bucket(rows))]
                    cell[0] += seconds
                    cell[1] += 1 if seconds else 0
                    rec["linears"] = rec.get("linears", 0.0) + seconds
            if ops:
                rec["stack"] = sum(ops.values())
        rec.update({k: timing[k] for k in ("schedule", "forward", "sample", "update_and_outputs", "total",
                                           "num_tokens", "num_seqs", "num_prefill_tokens")})
        self.steps.append(rec)


def stack_flops(mc) -> dict:
    """FLOPs per token of each linear kind over all layers (the stack's timers cover every layer)."""
    q, kv = mc.num_heads * mc.head_dim, mc.num_kv_heads * mc.head_dim
    h, i, n = mc.hidden_size, mc.intermediate_size, mc.num_layers
    return {"qkv": 2 * h * (q + 2 * kv) * n, "o_proj": 2 * q * h * n, "gate_up": 2 * h * 2 * i * n,
            "down": 2 * i * h * n}


def summarize(prof: Profiler, wall: float, cpu: float, threads: int, mc) -> dict:
    steps = prof.steps
    total = collections.defaultdict(float)
    for rec in steps:
        prefill = rec["num_prefill_tokens"] > 0
        for key, value in rec.items():
            if key in ("num_tokens", "num_seqs", "num_prefill_tokens"):
                continue
            total[key] += value
        total["attention_prefill_steps" if prefill else "attention_decode_steps"] += rec.get("attention", 0.0)
    # The stack's linears have no Python timer per call: fill their FLOPs from the step sizes.
    per_token = stack_flops(mc)
    stack_rows = collections.defaultdict(int)
    for rec in steps:
        if rec.get("stack"):
            stack_rows[bucket(rec["num_tokens"])] += rec["num_tokens"]
    for (kind, b), cell in prof.linear.items():
        if cell[2] == 0 and stack_rows.get(b):
            cell[2] = per_token[kind] * stack_rows[b]
    model = total["model_forward"]
    ops = total["linears"] + total["attention"] + total["norms+rotary"] + total.get("stack_other", 0.0)
    out = {
        "wall": wall, "steps": len(steps),
        "linears": total["linears"], "lm_head": total["lm_head"],
        "attention (prefill steps)": total["attention_prefill_steps"],
        "attention (decode steps)": total["attention_decode_steps"],
        "norms+rotary": total["norms+rotary"],
        "sampler": total["sample"], "scheduler": total["schedule"] + total["update_and_outputs"],
        # The engine's forward phase is the worker's input prep + model.forward + compute_logits.
        "python glue (model)": max(0.0, model - ops) if model else 0.0,
        "input prep (worker)": max(0.0, total["forward"] - model - total["lm_head"]),
        "idle threads (wall x threads - CPU)": max(0.0, wall * threads - cpu) / threads,
    }
    out["linear_table"] = {f"{k} {b}": {"seconds": s, "calls": n, "gflops": (f / s / 1e9) if s else 0.0}
                           for (k, b), (s, n, f) in sorted(prof.linear.items())}
    return out


def main(argv=None) -> int:
    from pagedcore.benchmarks import workloads
    from pagedcore.benchmarks.cli import add_workload_args
    from pagedcore.benchmarks.engine_setup import build_engine, warm_up
    from pagedcore.benchmarks.throughput import workload_lengths
    from pagedcore.entrypoints.engine_args import add_engine_args
    from pagedcore.ops.linear_isa import dispatch_report
    from pagedcore.sampling_params import SamplingParams

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    add_engine_args(ap)
    add_workload_args(ap)
    ap.add_argument("--torch-profile", action="store_true", help="torch.profiler over one large step")
    ap.add_argument("--output-json", default=None)
    ap.add_argument("--prefill-ab", nargs="*", default=None, metavar="LIBRARY",
                    help="instead: one 2048-token prefill step with each library (torch, widen, onednn_packed)")
    args = ap.parse_args(argv)
    if args.prefill_ab is not None:
        prefill_ab(args.dtype if args.dtype != "auto" else "float32", args.prefill_ab or ["torch", "onednn_packed"])
        return 0
    if args.workload == "synthetic" and args.workload_file is None:
        args.workload_file = os.path.join(os.path.dirname(__file__), "workloads", "workload_n128_seed0.json")
        args.workload = "file"
    # The op split needs the Python path's calls (compute_logits, the norm and rotary wrappers): the
    # one-call greedy step (models/greedy_decode.py) would hide them. StepProbe (bench throughput)
    # times that path instead.
    os.environ["PAGEDCORE_GREEDY_DECODE"] = "0"
    engine, setup = build_engine(args)
    mc = engine.view.model_config
    requests = workloads.make_workload(args.workload, mc.vocab_size, args.num_prompts, args.seed_workload,
                                       args.workload_file, **workload_lengths(args))
    warm_up(engine, mc.vocab_size)
    print("(the one-call greedy step is off here, PAGEDCORE_GREEDY_DECODE=0: steps take the Python path)")
    print(f"cpu: {_cpu_name()}  loadavg {os.getloadavg()}  threads {torch.get_num_threads()}  dtype "
          f"{setup['dtype']} ({setup['weight_format']})")
    for family, what in dispatch_report():
        print(f"  {family:22s} {what}")
    threads = torch.get_num_threads()
    with Profiler(engine) as prof:
        for i, r in enumerate(requests):
            params = SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=True)
            engine.add_request(f"p-{i}", prompt_token_ids=r.prompt_token_ids, params=params, output_kind="final")
        cpu0, t0 = _cpu_seconds(), time.perf_counter()
        num_output = 0
        profiled = False
        while engine.has_unfinished_requests():
            if args.torch_profile and not profiled and engine.view.scheduler_stats().num_waiting > 0:
                profiled = True
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as tp:
                    outs = engine.step()
            else:
                outs = engine.step()
            num_output += sum(len(o.token_ids) for out in outs if out.finished for o in out.outputs)
        wall, cpu = time.perf_counter() - t0, _cpu_seconds() - cpu0
    result = summarize(prof, wall, cpu, threads, mc)
    print(f"{len(requests)} requests, {num_output} output tokens in {wall:.1f} s ({num_output / wall:.1f} "
          f"output tok/s incl. timer overhead), {result['steps']} steps; loadavg {os.getloadavg()}")
    print(f"{'bucket':40s} {'seconds':>8s} {'share':>6s}")
    for key, value in result.items():
        if key in ("wall", "steps", "linear_table"):
            continue
        print(f"{key:40s} {value:8.2f} {100 * value / wall:5.1f}%")
    print(f"\n{'linear kind, rows':24s} {'seconds':>8s} {'calls':>6s} {'GFLOP/s':>8s}")
    for key, cell in result["linear_table"].items():
        print(f"{key:24s} {cell['seconds']:8.2f} {cell['calls']:6d} {cell['gflops']:8.1f}")
    if args.torch_profile and profiled:
        print(tp.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"setup": setup, "loadavg": os.getloadavg(), **result}, f, indent=1, default=str)
    return 0


def prefill_ab(dtype: str, libraries: list[str], num_seqs: int = 4, seq_len: int = 512, repeats: int = 3) -> None:
    """One prefill step (num_seqs x seq_len tokens, the Python layer loop: above max_rows) with each
    library behind the dense layers, alternated, best of `repeats`: the end-to-end effect of the GEMM
    choice on prefill steps, on the loaded model with its real attention, norms and glue."""
    from pagedcore.layers.attention import AttentionMetadata
    from pagedcore.layers.linear import LibraryBinding
    from pagedcore.loader.model_loader import load_model

    model = load_model(dtype=dtype, load_tokenizer=False).model
    mc = model.config
    block = 16
    blocks_per_seq = -(-seq_len // block)
    kv = torch.zeros(mc.num_layers, 2, num_seqs * blocks_per_seq, mc.num_kv_heads, block, mc.head_dim,
                     dtype=mc.torch_dtype)  # [layers, 2, blocks, kv_heads, block, head_dim]
    T = num_seqs * seq_len
    positions = torch.arange(seq_len).repeat(num_seqs)  # [T]
    seq_of = torch.arange(num_seqs).repeat_interleave(seq_len)  # [T]
    tables = torch.arange(num_seqs * blocks_per_seq, dtype=torch.int32).view(num_seqs, blocks_per_seq)
    meta = AttentionMetadata(
        slot_mapping=(tables[seq_of, positions // block].long() * block + positions % block),
        block_tables=tables, seq_lens=torch.full((num_seqs,), seq_len, dtype=torch.int32),
        query_start_loc=torch.arange(num_seqs + 1, dtype=torch.int32) * seq_len,
        max_query_len=seq_len, max_seq_len=seq_len)
    ids = torch.randint(0, mc.vocab_size, (T,))
    bindings = [m._library for m in model.modules() if isinstance(getattr(m, "_library", None), LibraryBinding)]
    best = {lib: float("inf") for lib in libraries}
    flop = T * 2 * sum(m.in_features * m.out_features for m in model.modules()
                       if isinstance(getattr(m, "_library", None), LibraryBinding))
    with torch.inference_mode():
        for _ in range(repeats):
            for lib in libraries:
                for b in bindings:
                    b.library = lib
                model(ids, positions, kv, meta)  # warm (packs on first use where needed)
                t0 = time.perf_counter()
                model(ids, positions, kv, meta)
                best[lib] = min(best[lib], time.perf_counter() - t0)
    print(f"prefill step {num_seqs} x {seq_len} tokens, {dtype}, {torch.get_num_threads()} threads, loadavg "
          f"{os.getloadavg()} ({_cpu_name()}):")
    for lib, seconds in best.items():
        print(f"  {lib:14s} {seconds * 1e3:8.1f} ms  (layers' linears {flop / seconds / 1e9:6.1f} GFLOP/s "
              "of the whole forward)")


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    sys.exit(main())
