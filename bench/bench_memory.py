"""Resident memory over time under varied load: the two reproductions of the issue "Memory grows
without bound under load", runnable against any checkout.

    offline: LLM(), then rounds of llm.generate on 32 random prompts (5-300 random token ids,
             temperature 0.7, max_tokens 8-64); RSS after each round.
    serve:   `pagedcore serve` in a subprocess, 16 concurrent clients for --seconds: streamed chats
             (30% aborted mid-stream), completions and a few bad requests; the server's RSS every
             --sample-seconds, then once more after it has been idle. (Since the KV cache is committed
             in the background, RSS climbs to its full size within the first seconds after /health.)

    .venv/bin/python bench/bench_memory.py offline --rounds 8
    .venv/bin/python bench/bench_memory.py serve --seconds 180
    .venv/bin/python bench/bench_memory.py commit --gib 4     # time to commit a KV-sized buffer
    .venv/bin/python bench/bench_memory.py commit --background   # the same on a thread, mmap waits meanwhile

Prints one line per sample: seconds since start, RSS in MiB, and what ran. Run it on the engine
checkout you want to measure (PYTHONPATH or a worktree's venv).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import time


def rss_mib(pid: int | str = "self") -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def offline(args) -> None:
    from pagedcore import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(**({"kv_cache_memory": args.kv_cache_memory} if args.kv_cache_memory else {}))
    print(f"{time.perf_counter() - t0:7.1f} s  {rss_mib():7.0f} MiB  after LLM()", flush=True)
    wait = getattr(llm.llm_engine, "wait_for_kv_commit", None)   # checkouts since the background commit
    if wait is not None:
        wait()
        print(f"{time.perf_counter() - t0:7.1f} s  {rss_mib():7.0f} MiB  KV cache committed (background)", flush=True)
    rng = random.Random(args.seed)
    for r in range(args.rounds):
        prompts = [{"prompt_token_ids": [rng.randrange(100, 40000) for _ in range(rng.randint(5, 300))]}
                   for _ in range(32)]
        params = [SamplingParams(temperature=0.7, max_tokens=rng.randint(8, 64)) for _ in range(32)]
        llm.generate(prompts, params, use_tqdm=False)
        print(f"{time.perf_counter() - t0:7.1f} s  {rss_mib():7.0f} MiB  after round {r + 1} "
              f"({llm.llm_engine.num_unfinished_requests} requests left)", flush=True)


async def _client(http, rng: random.Random, deadline: float, counts: dict) -> None:
    import httpx

    while time.monotonic() < deadline:
        kind = rng.random()
        try:
            if kind < 0.05:     # bad requests: each must be a 4xx, never a crash
                r = await http.post("/v1/completions", json={"model": "x" * rng.randint(0, 3), "prompt": "hi",
                                                             "max_tokens": -1})
                counts[f"bad {r.status_code}"] = counts.get(f"bad {r.status_code}", 0) + 1
            elif kind < 0.35:   # completions, not streamed
                r = await http.post("/v1/completions", json={
                    "prompt": " ".join(rng.choice(("the", "a", "cat", "engine", "memory", "block", "cache"))
                                       for _ in range(rng.randint(3, 200))),
                    "max_tokens": rng.randint(8, 64), "temperature": 0.7})
                counts[f"completion {r.status_code}"] = counts.get(f"completion {r.status_code}", 0) + 1
            else:               # streamed chats, 30% of them dropped by the client mid-stream
                abort_after = rng.randint(1, 10) if rng.random() < 0.3 else None
                body = {"messages": [{"role": "user", "content": "Tell me about " + " ".join(
                    rng.choice(("paging", "caches", "schedulers", "GPUs", "France", "tokens"))
                    for _ in range(rng.randint(1, 60)))}], "max_tokens": rng.randint(8, 64),
                        "temperature": 0.7, "stream": True}
                async with http.stream("POST", "/v1/chat/completions", json=body) as r:
                    n = 0
                    async for line in r.aiter_lines():
                        n += line.startswith("data:")
                        if abort_after is not None and n >= abort_after:
                            break
                key = "chat aborted" if abort_after is not None else f"chat {r.status_code}"
                counts[key] = counts.get(key, 0) + 1
        except httpx.HTTPError as error:
            counts[type(error).__name__] = counts.get(type(error).__name__, 0) + 1


async def _load(port: int, seconds: float, num_clients: int, seed: int, server_pid: int, sample_s: float,
                t0: float) -> dict:
    import httpx

    counts: dict = {}
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
        clients = [asyncio.create_task(_client(http, random.Random(seed + i), deadline, counts))
                   for i in range(num_clients)]
        while time.monotonic() < deadline:
            await asyncio.sleep(sample_s)
            print(f"{time.perf_counter() - t0:7.1f} s  {rss_mib(server_pid):7.0f} MiB  under load {counts}", flush=True)
        await asyncio.gather(*clients)
    return counts


def serve(args) -> None:
    import httpx

    # -S passes on when this interpreter runs without site (a worktree measured through PYTHONPATH).
    cmd = [sys.executable, *(["-S"] if sys.flags.no_site else []), "-m", "pagedcore.cli", "serve", "--port", str(args.port), "--grpc-port",
           str(args.port + 1)]
    if args.kv_cache_memory:
        cmd += ["--kv-cache-memory", args.kv_cache_memory]
    t0 = time.perf_counter()
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{args.port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.perf_counter() - t0 > 300:
                raise SystemExit("the server did not start")
            time.sleep(0.5)
        print(f"{time.perf_counter() - t0:7.1f} s  {rss_mib(server.pid):7.0f} MiB  server ready", flush=True)
        counts = asyncio.run(_load(args.port, args.seconds, args.clients, args.seed, server.pid,
                                   args.sample_seconds, t0))
        time.sleep(args.sample_seconds)
        metrics = httpx.get(f"http://127.0.0.1:{args.port}/metrics").text
        usage = [line for line in metrics.splitlines() if line.startswith("pagedcore:kv_cache_usage_perc")]
        print(f"{time.perf_counter() - t0:7.1f} s  {rss_mib(server.pid):7.0f} MiB  idle; {usage} {counts}", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=60)


def commit(args) -> None:
    import torch

    from pagedcore.engine import host_memory

    if args.background:
        commit_background(args, torch, host_memory)
        return
    for huge_pages in (False, True):
        buf = torch.empty(int(args.gib * 2**30), dtype=torch.uint8)
        t = time.perf_counter()
        host_memory.commit_pages(buf, huge_pages=huge_pages)
        print(f"commit {args.gib} GiB, huge_pages={huge_pages}: {time.perf_counter() - t:.2f} s", flush=True)
        del buf


def commit_background(args, torch, host_memory) -> None:
    """The engine's background commit (host_memory._BACKGROUND_CHUNK_BYTES a madvise call), then one call
    for the whole buffer, each
    timed, with what the process's own memory mapping waits meanwhile: an mmap + munmap of a 64 MiB
    tensor every 2 ms (a step's large temporaries take that path)."""
    chunk_bytes = host_memory._BACKGROUND_CHUNK_BYTES
    try:
        for label, chunk in ((f"{chunk_bytes >> 20} MiB calls", chunk_bytes), ("one call", int(args.gib * 2**30))):
            host_memory._BACKGROUND_CHUNK_BYTES = chunk
            buf = torch.empty(int(args.gib * 2**30), dtype=torch.uint8)
            running = host_memory.commit_in_background(buf, "bench buffer")
            if running is None:
                print("no MADV_POPULATE_WRITE here: the engine commits in the foreground")
                return
            waits = []
            while not running.done:
                t = time.perf_counter()
                scratch = torch.empty(64 * 2**20, dtype=torch.uint8)
                del scratch
                waits.append(time.perf_counter() - t)
                time.sleep(0.002)
            waits.sort()
            print(f"commit {args.gib} GiB in the background, {label}: {running.seconds:.2f} s; {len(waits)} "
                  f"mmap+munmap meanwhile, median {waits[len(waits) // 2] * 1e3:.2f} ms, max {waits[-1] * 1e3:.1f} ms",
                  flush=True)
            del buf
    finally:
        host_memory._BACKGROUND_CHUNK_BYTES = chunk_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("offline")
    p.add_argument("--rounds", type=int, default=8)
    p = sub.add_parser("serve")
    p.add_argument("--seconds", type=float, default=360)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--sample-seconds", type=float, default=30)
    p.add_argument("--port", type=int, default=8470)
    p = sub.add_parser("commit")
    p.add_argument("--gib", type=float, default=4)
    p.add_argument("--background", action="store_true",
                   help="the engine's background commit: its time and what an mmap waits meanwhile")
    for p in sub.choices.values():
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--kv-cache-memory", default=None)
    args = parser.parse_args()
    {"offline": offline, "serve": serve, "commit": commit}[args.mode](args)


if __name__ == "__main__":
    main()
