"""`pagedcore bench serve`: a load generator for any OpenAI-compatible server (pagedcore, vLLM, ...).

Each request streams POST /v1/completions with the prompt as token ids (vLLM and pagedcore take them;
the same ids reach every server, no tokenizer drift), greedy, ignore_eos, include_usage. Arrivals are
Poisson at --request-rate (exponential gaps from a fixed seed; `inf` sends all at once), optionally
capped at --max-concurrency requests in flight. Per request: TTFT (send to first text chunk),
ITL (gaps between later chunks), TPOT ((E2E - TTFT) / (output tokens - 1)), E2E. Several rates make
a sweep: one JSON result with a run per rate and, with matplotlib, PNG plots.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from pagedcore.benchmarks import stats, workloads


@dataclass
class RequestResult:
    prompt_len: int
    max_tokens: int
    success: bool = False
    error: str = ""
    ttft: float = math.nan
    e2e: float = math.nan
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    start: float = 0.0                 # seconds since the run started

    @property
    def tpot(self) -> float:
        if self.output_tokens < 2 or math.isnan(self.ttft):
            return math.nan
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


def arrival_offsets(num: int, rate: float, seed: int) -> np.ndarray:
    """Send times (s from the start) of num requests arriving as a Poisson process at `rate` per second;
    all zeros for rate inf."""
    if math.isinf(rate):
        return np.zeros(num)
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, num)
    gaps[0] = 0.0                      # the first request goes at once
    return np.cumsum(gaps)


def iter_sse_data(lines):
    """The JSON payloads of an SSE stream's `data:` lines, up to `data: [DONE]`."""
    for line in lines:
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        yield json.loads(payload)


async def send_one(client, url: str, model: str, req: workloads.BenchRequest, t_run: float,
                   headers: dict) -> RequestResult:
    body = {"model": model, "prompt": req.prompt_token_ids, "max_tokens": req.max_tokens, "temperature": 0.0,
            "ignore_eos": req.ignore_eos, "stream": True, "stream_options": {"include_usage": True}}
    res = RequestResult(len(req.prompt_token_ids), req.max_tokens)
    t0 = time.perf_counter()
    res.start = t0 - t_run
    last = t0
    chunks = 0
    try:
        async with client.stream("POST", url, json=body, headers=headers) as resp:
            if resp.status_code != 200:
                res.error = f"HTTP {resp.status_code}: {(await resp.aread()).decode(errors='replace')[:200]}"
                return res
            async for line in resp.aiter_lines():
                for chunk in iter_sse_data([line]):
                    if "error" in chunk:
                        res.error = str(chunk["error"])[:200]
                        return res
                    usage = chunk.get("usage")
                    if usage:
                        res.output_tokens = int(usage.get("completion_tokens", 0))
                    choices = chunk.get("choices") or []
                    if not choices or not (choices[0].get("text") or choices[0].get("delta", {}).get("content")):
                        continue
                    now = time.perf_counter()
                    if chunks == 0:
                        res.ttft = now - t0
                    else:
                        res.itl.append(now - last)
                    last = now
                    chunks += 1
        res.e2e = time.perf_counter() - t0
        if res.output_tokens == 0:
            res.output_tokens = chunks   # a server without include_usage: one chunk ~ one token
        res.success = chunks > 0
        if not res.success:
            res.error = "the stream ended without any text"
    except Exception as e:  # a bench records failures; it does not stop at the first one
        res.error = f"{type(e).__name__}: {e}"[:200]
    return res


async def run_at_rate(base_url: str, model: str, requests, rate: float, max_concurrency: int | None,
                      seed: int, timeout: float, api_key: str | None) -> dict:
    import httpx

    url = base_url.rstrip("/") + "/v1/completions"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    offsets = arrival_offsets(len(requests), rate, seed)
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    # A pool at least as large as what may be in flight: a smaller one would queue requests client-side
    # and the wait would show up as TTFT.
    pool = httpx.Limits(max_connections=max_concurrency or len(requests), max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=pool) as client:
        t_run = time.perf_counter()

        async def one(req, offset):
            delay = t_run + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if limit is None:
                return await send_one(client, url, model, req, t_run, headers)
            async with limit:
                return await send_one(client, url, model, req, t_run, headers)

        results = await asyncio.gather(*(one(r, o) for r, o in zip(requests, offsets)))
        duration = time.perf_counter() - t_run
    return summarize_run(results, duration, rate, max_concurrency)


def summarize_run(results: list[RequestResult], duration: float, rate: float, max_concurrency) -> dict:
    ok = [r for r in results if r.success]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_len for r in ok)
    errors = {}
    for r in results:
        if not r.success:
            errors[r.error] = errors.get(r.error, 0) + 1
    itl = [x for r in ok for x in r.itl]
    return {
        "request_rate": "inf" if math.isinf(rate) else rate, "max_concurrency": max_concurrency,
        "duration_seconds": duration, "num_requests": len(results), "completed": len(ok),
        "failed": len(results) - len(ok), "errors": errors,
        "request_throughput": len(ok) / duration, "output_token_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
        "prompt_tokens": in_tokens, "output_tokens": out_tokens,
        "ttft_ms": stats.distribution([r.ttft for r in ok], 1000),
        "tpot_ms": stats.distribution([r.tpot for r in ok if not math.isnan(r.tpot)], 1000),
        "itl_ms": stats.distribution(itl, 1000),
        "e2e_ms": stats.distribution([r.e2e for r in ok], 1000),
        "requests": [asdict(r) | {"tpot": r.tpot} for r in results],
    }


def format_run(run: dict) -> str:
    conc = run["max_concurrency"] or "unlimited"
    lines = [f"request rate {run['request_rate']} req/s, concurrency {conc}: {run['completed']}/"
             f"{run['num_requests']} succeeded in {run['duration_seconds']:.2f} s",
             f"  throughput: {run['request_throughput']:.2f} req/s, {run['output_token_throughput']:.1f} output tok/s, "
             f"{run['total_token_throughput']:.1f} total tok/s",
             f"  {'':6} {'mean':>9} {'p50':>9} {'p90':>9} {'p99':>9}  (ms)"]
    for name in ("ttft", "tpot", "itl", "e2e"):
        d = run[f"{name}_ms"]
        lines.append(f"  {name.upper():6} {d['mean']:>9.1f} {d['p50']:>9.1f} {d['p90']:>9.1f} {d['p99']:>9.1f}")
    for error, count in run["errors"].items():
        lines.append(f"  error x{count}: {error}")
    return "\n".join(lines)


def discover_model(base_url: str, api_key: str | None, timeout: float = 10.0) -> str:
    """The first model id of GET /v1/models (what `--model` defaults to)."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    resp = httpx.get(base_url.rstrip("/") + "/v1/models", headers=headers, timeout=timeout)
    resp.raise_for_status()
    data = resp.json().get("data") or []
    if not data:
        raise ValueError(f"{base_url}/v1/models lists no model; pass --model NAME")
    return data[0]["id"]




def cmd_serve(args) -> int:
    import logging

    from pagedcore.benchmarks.throughput import workload_lengths

    logging.getLogger("httpx").setLevel(logging.WARNING)   # one INFO line per request drowns the report

    requests = workloads.make_workload(args.workload, args.vocab_size, args.num_prompts, args.seed_workload,
                                       args.workload_file, **workload_lengths(args))
    model = args.model or discover_model(args.base_url, args.api_key)
    print(f"pagedcore bench serve: {args.base_url}, model {model}, {len(requests)} requests "
          f"({args.workload}), rates {args.request_rate}")
    runs = []
    for rate in args.request_rate:
        run = asyncio.run(run_at_rate(args.base_url, model, requests, rate, args.max_concurrency,
                                      args.seed_workload, args.timeout, args.api_key))
        runs.append(run)
        print(format_run(run))
    result = {"base_url": args.base_url, "model": model, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
              "workload": {"kind": args.workload, "file": args.workload_file, **workloads.summarize(requests)},
              "runs": runs}
    with open(args.output_json, "w") as f:
        json.dump(result, f, indent=1)
    print(f"result: {args.output_json}")
    if args.plot_dir:
        from pagedcore.benchmarks import plots
        for path in plots.write_serve_plots(result, args.plot_dir):
            print(f"plot: {path}")
    return 1 if all(r["completed"] == 0 for r in runs) else 0
