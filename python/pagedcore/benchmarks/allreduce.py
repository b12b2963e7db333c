"""`pagedcore bench allreduce`: latency of the tensor-parallel all-reduce of a [num_tokens, hidden_size]
activation (what each layer does twice under TP) between rank processes on this machine, shared
memory against gloo (torch.distributed over loopback TCP), fp32 and bf16.

Each rank is a spawned process bound to its own core with one torch thread (as the mp executor runs
them); every figure is the median (and p90) over back-to-back calls, timed inside rank 0."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import time

from pagedcore.benchmarks.machine import cpu_info, describe_cpu

DTYPES = ("float32", "bfloat16")
BACKENDS = ("shm", "gloo")


def _bind(rank: int) -> None:
    import torch

    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[rank % len(cores)]})
    torch.set_num_threads(1)


def _rank_main(rank: int, specs: dict, cases: list, iters: int, warmup: int, results) -> None:
    import torch

    from pagedcore.distributed import comm_spec as cs

    _bind(rank)
    out = {}
    for backend, spec in specs.items():
        comm = cs.open_communicator(spec, rank, timeout=120)
        for rows, hidden, dtype_name in cases:
            x = torch.randn(rows, hidden).to(getattr(torch, dtype_name))
            for _ in range(warmup):
                comm.all_reduce(x)
            times = []
            for _ in range(iters):
                start = time.perf_counter()
                comm.all_reduce(x)
                times.append(time.perf_counter() - start)
            times.sort()
            out[f"{backend}/{rows}/{dtype_name}"] = {"median_us": statistics.median(times) * 1e6,
                                                     "p90_us": times[int(0.9 * (len(times) - 1))] * 1e6}
        comm.close()
    if rank == 0:
        results.put(out)


def measure(hidden_size: int, rows: list[int], dtypes=DTYPES, backends=BACKENDS, iters: int = 200,
            warmup: int = 20, world_size: int = 2) -> dict:
    """{"<backend>/<rows>/<dtype>": {"median_us", "p90_us"}} measured in rank 0 of `world_size` processes."""
    from pagedcore.distributed import comm_spec as cs

    cases = [(r, hidden_size, d) for r in rows for d in dtypes]
    max_bytes = max(r for r in rows) * hidden_size * 4
    specs = {}
    for backend in backends:
        if backend == "shm":
            specs["shm"] = cs.create_shm_group(world_size, max_bytes=max(max_bytes, 4096))
        elif backend == "gloo":
            specs["gloo"] = cs.create_gloo_group(world_size)
        else:
            raise ValueError(f"unknown backend {backend!r}; give shm and/or gloo")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(r, specs, cases, iters, warmup, results), daemon=True)
             for r in range(world_size)]
    try:
        for p in procs:
            p.start()
        out = results.get(timeout=600)
        for p in procs:
            p.join(60)
        if any(p.exitcode != 0 for p in procs):
            raise RuntimeError(f"a rank failed: exit codes {[p.exitcode for p in procs]}")
        return out
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(10)
        for spec in specs.values():
            cs.release(spec)


def format_table(result: dict, hidden_size: int, rows: list[int], dtypes, backends, world_size: int) -> str:
    lines = [f"all-reduce of [rows, {hidden_size}], {world_size} ranks (spawned, each on its own core, 1 thread): "
             "median (p90) microseconds per call"]
    head = f"{'rows':>6} {'dtype':>9} {'bytes':>9}" + "".join(f" {b:>18}" for b in backends)
    if "shm" in backends and "gloo" in backends:
        head += f" {'gloo/shm':>9}"
    lines.append(head)
    for r in rows:
        for d in dtypes:
            nbytes = r * hidden_size * (4 if d == "float32" else 2)
            line = f"{r:>6} {d:>9} {nbytes:>9}"
            for b in backends:
                m = result[f"{b}/{r}/{d}"]
                line += f" {m['median_us']:>9.1f} ({m['p90_us']:>6.1f})"
            if "shm" in backends and "gloo" in backends:
                line += f" {result[f'gloo/{r}/{d}']['median_us'] / result[f'shm/{r}/{d}']['median_us']:>8.1f}x"
            lines.append(line)
    return "\n".join(lines)


def cmd_allreduce(args) -> int:
    info = cpu_info()
    if len(os.sched_getaffinity(0)) < args.world_size:
        print(f"note: {args.world_size} ranks on {len(os.sched_getaffinity(0))} usable cores share cores: "
              "the figures include time slicing")
    result = measure(args.hidden_size, args.rows, args.dtypes, args.backends, args.iters, args.warmup, args.world_size)
    info_after = cpu_info()
    print(f"CPU: {describe_cpu(info)}")
    print(format_table(result, args.hidden_size, args.rows, args.dtypes, args.backends, args.world_size))
    la = ", ".join(f"{x:.2f}" for x in info_after["load_average"])
    print(f"load average after: {la} (a shared machine: figures are noisy)")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"machine": info, "load_average_after": info_after["load_average"],
                       "hidden_size": args.hidden_size, "world_size": args.world_size, "iters": args.iters,
                       "results": result}, f, indent=2)
    return 0
