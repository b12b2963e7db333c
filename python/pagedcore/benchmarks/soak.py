"""`pagedcore bench soak`: hold a `pagedcore serve` under steady load and check that nothing grows.

It starts the server itself (so it can watch the process), then for --duration seconds keeps
--concurrency clients busy with a mix over both front ends: HTTP completions and chat, streaming and
not, gRPC Generate and GenerateStream; --abort-fraction of the streams hang up after their first
chunk. Every --sample-interval s it samples the server's RSS and open file descriptors (/proc) and,
from /metrics, KV cache usage and the running / waiting queues.

A request without an answer within --timeout is counted (the client hangs up, which aborts it) but
does not fail the run: a shared CPU may just be slow; the leak checks then cover those aborts too.
It fails (exit 1) on any 5xx or gRPC INTERNAL/UNKNOWN, on a client error other than 429, on RSS,
fds or the waiting queue growing from the first half of the run to the second (past warm-up) beyond
a tolerance, or on a block leak: once the load stops and the queues drain, KV usage must be back at
its idle start value (0) and open fds near their start.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shlex
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

import httpx

MIB = 1 << 20
# Growth tolerances, second half vs first half of the run (medians, warm-up excluded): allocator
# arenas and caches settle over minutes, so a small rise is not a leak; a steady climb is.
RSS_TOLERANCE = (0.10, 64 * MIB)       # +10% and at least 64 MiB
FD_TOLERANCE = 16
WARMUP_FRACTION = 0.2


@dataclass
class Sample:
    t: float
    rss_bytes: int
    num_fds: int
    kv_cache_usage: float
    num_running: float
    num_waiting: float


@dataclass
class Tally:
    ok: dict = field(default_factory=dict)          # kind -> completed requests
    aborted: dict = field(default_factory=dict)     # kind -> streams the client hung up on
    throttled: int = 0                              # 429 / RESOURCE_EXHAUSTED (allowed, counted)
    timed_out: int = 0                              # no answer within --timeout (counted; see verdict)
    failures: list = field(default_factory=list)    # "kind: what happened" (first 50)
    num_failures: int = 0

    def fail(self, kind: str, what: str) -> None:
        self.num_failures += 1
        if len(self.failures) < 50:
            self.failures.append(f"{kind}: {what}")
            print(f"[soak] failure: {kind}: {what}", flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _proc_sample(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def _metrics(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith("pagedcore:"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


class Soak:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.tally = Tally()
        self.samples: list[Sample] = []
        self.port, self.grpc_port = _free_port(), _free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    # -- the server -----------------------------------------------------------------------------------
    def start_server(self) -> subprocess.Popen:
        a = self.args
        cmd = [sys.executable, "-m", "pagedcore.cli", "serve", "--port", str(self.port), "--grpc-port",
               str(self.grpc_port), "--kv-cache-memory", a.kv_cache_memory, "--max-model-len", str(a.max_model_len),
               "--uvicorn-log-level", "warning",
               # The cache resident before the first sample: its pages coming in on the commit thread would
               # read as growth between the halves (a --serve-args value after this one wins).
               "--kv-cache-commit", "startup", *shlex.split(a.serve_args or "")]
        self.log = open(a.server_log, "w") if a.server_log else subprocess.DEVNULL
        proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with {proc.returncode} while starting: {' '.join(cmd)}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return proc
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        proc.kill()
        raise RuntimeError("the server was not ready after 300 s")

    async def sample(self, client: httpx.AsyncClient, pid: int, t0: float) -> Sample:
        rss, fds = _proc_sample(pid)
        m = _metrics((await client.get(self.url + "/metrics", timeout=30)).text)
        s = Sample(time.monotonic() - t0, rss, fds, m.get("pagedcore:kv_cache_usage_perc", 0.0),
                   m.get("pagedcore:num_requests_running", 0.0), m.get("pagedcore:num_requests_waiting", 0.0))
        self.samples.append(s)
        return s

    # -- the clients ----------------------------------------------------------------------------------
    def _body(self, chat: bool, stream: bool) -> dict:
        n = self.rng.randint(1, self.args.max_tokens)
        body = {"max_tokens": n, "temperature": self.rng.choice([0.0, 0.8]), "stream": stream, "ignore_eos": True}
        words = " ".join(self.rng.choice(["the", "cat", "sat", "on", "a", "mat", "and", "then"])
                         for _ in range(self.rng.randint(2, 40)))
        if chat:
            body["messages"] = [{"role": "user", "content": words}]
        else:
            body["prompt"] = words
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    async def http_call(self, client: httpx.AsyncClient, chat: bool, stream: bool, abort: bool) -> None:
        kind = f"http-{'chat' if chat else 'completion'}-{'stream' if stream else 'whole'}"
        route = "/v1/chat/completions" if chat else "/v1/completions"
        try:
            if not stream:
                r = await client.post(self.url + route, json=self._body(chat, False))
                self._http_status(kind, r.status_code, r.text)
                return
            async with client.stream("POST", self.url + route, json=self._body(chat, True)) as r:
                if r.status_code != 200:
                    self._http_status(kind, r.status_code, (await r.aread()).decode(errors="replace"))
                    return
                async for line in r.aiter_lines():
                    if abort and line.startswith("data: "):
                        self.tally.aborted[kind] = self.tally.aborted.get(kind, 0) + 1
                        return                    # hang up mid-stream
                    if line.startswith("data: {\"error\""):
                        self.tally.fail(kind, line[:300])
                        return
        except httpx.TimeoutException:
            self.tally.timed_out += 1
            return
        except httpx.HTTPError as error:
            self.tally.fail(kind, f"{type(error).__name__}: {error}")
            return
        self.tally.ok[kind] = self.tally.ok.get(kind, 0) + 1

    def _http_status(self, kind: str, status: int, text: str) -> None:
        if status == 200:
            self.tally.ok[kind] = self.tally.ok.get(kind, 0) + 1
        elif status == 429:
            self.tally.throttled += 1
        else:
            self.tally.fail(kind, f"HTTP {status}: {text[:300]}")

    async def grpc_call(self, stub, pb, stream: bool, abort: bool) -> None:
        import grpc

        kind = f"grpc-{'stream' if stream else 'generate'}"
        params = pb.Parameters(stopping=pb.StoppingCriteria(max_new_tokens=self.rng.randint(1, self.args.max_tokens)))
        text = " ".join(self.rng.choice(["one", "two", "three", "four"]) for _ in range(self.rng.randint(2, 40)))
        try:
            if stream:
                call = stub.GenerateStream(pb.SingleGenerationRequest(request=pb.GenerationRequest(text=text),
                                                                      params=params), timeout=self.args.timeout)
                async for _ in call:
                    if abort:
                        call.cancel()
                        self.tally.aborted[kind] = self.tally.aborted.get(kind, 0) + 1
                        return
            else:
                await stub.Generate(pb.BatchedGenerationRequest(requests=[pb.GenerationRequest(text=text)],
                                                                params=params), timeout=self.args.timeout)
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                self.tally.throttled += 1
            elif error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                self.tally.timed_out += 1
            elif error.code() != grpc.StatusCode.CANCELLED:
                self.tally.fail(kind, f"{error.code().name}: {error.details()}")
            return
        self.tally.ok[kind] = self.tally.ok.get(kind, 0) + 1

    async def client_loop(self, http: httpx.AsyncClient, stub, pb, deadline: float) -> None:
        while time.monotonic() < deadline:
            abort = self.rng.random() < self.args.abort_fraction
            pick = self.rng.random()
            if stub is not None and pick < self.args.grpc_fraction:
                await self.grpc_call(stub, pb, stream=self.rng.random() < 0.5, abort=abort)
            else:
                await self.http_call(http, chat=self.rng.random() < 0.5, stream=self.rng.random() < 0.7, abort=abort)

    async def run_load(self, pid: int) -> dict:
        a = self.args
        limits = httpx.Limits(max_connections=a.concurrency + 4, max_keepalive_connections=a.concurrency + 4)
        async with httpx.AsyncClient(timeout=a.timeout, limits=limits) as http:
            t0 = time.monotonic()
            idle_start = await self.sample(http, pid, t0)
            stub = pb = channel = None
            if a.grpc_fraction > 0:
                import grpc

                from pagedcore.serving.grpc.stubs import generation_pb2 as pb
                from pagedcore.serving.grpc.stubs import generation_pb2_grpc as pb_grpc

                channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.grpc_port}")
                stub = pb_grpc.GenerationServiceStub(channel)
            deadline = t0 + a.duration
            clients = [asyncio.ensure_future(self.client_loop(http, stub, pb, deadline)) for _ in range(a.concurrency)]
            while time.monotonic() < deadline:
                s = await self.sample(http, pid, t0)
                print(f"[soak {s.t:6.0f} s] rss {s.rss_bytes / MIB:7.1f} MiB  fds {s.num_fds:4d}"
                      f"  kv {s.kv_cache_usage:5.3f}  running {s.num_running:3.0f}  waiting {s.num_waiting:3.0f}  ok {sum(self.tally.ok.values())}"
                      f"  failures {self.tally.num_failures}  load {os.getloadavg()[0]:.2f}", flush=True)
                await asyncio.sleep(a.sample_interval)
            await asyncio.gather(*clients)
            if channel is not None:
                await channel.close()
            # Drained: the queues empty, then the blocks and fds must be back where they started.
            drain_deadline = time.monotonic() + 120
            while True:
                end = await self.sample(http, pid, t0)
                if (end.num_running == end.num_waiting == 0 and end.kv_cache_usage <= idle_start.kv_cache_usage) \
                        or time.monotonic() > drain_deadline:
                    break
                await asyncio.sleep(0.5)
            return {"idle_start": asdict(idle_start), "idle_end": asdict(end)}


def verdict(samples: list[Sample], idle: dict, tally: Tally, duration: float) -> list[str]:
    """The reasons the run failed (empty: it passed)."""
    problems = []
    if tally.num_failures:
        problems.append(f"{tally.num_failures} failed requests, e.g. {tally.failures[:3]}")
    if not tally.ok:
        problems.append("no request completed")
    start, end = idle["idle_start"], idle["idle_end"]
    if end["num_running"] or end["num_waiting"]:
        problems.append(f"requests still queued 120 s after the load stopped: {end}")
    if end["kv_cache_usage"] > start["kv_cache_usage"]:
        problems.append(f"block leak: KV usage {end['kv_cache_usage']:.4f} when idle, {start['kv_cache_usage']:.4f} "
                        "at the start")
    if end["num_fds"] > start["num_fds"] + FD_TOLERANCE:
        problems.append(f"fd leak: {end['num_fds']} open when idle, {start['num_fds']} at the start")
    steady = [s for s in samples[1:-1] if s.t >= WARMUP_FRACTION * duration]
    if len(steady) >= 4:
        half = len(steady) // 2
        first, second = steady[:half], steady[half:]

        def med(xs, key):
            return statistics.median(getattr(x, key) for x in xs)

        rss0, rss1 = med(first, "rss_bytes"), med(second, "rss_bytes")
        if rss1 > rss0 * (1 + RSS_TOLERANCE[0]) and rss1 - rss0 > RSS_TOLERANCE[1]:
            problems.append(f"RSS grew from {rss0 / MIB:.0f} MiB to {rss1 / MIB:.0f} MiB (medians of the halves)")
        fd0, fd1 = med(first, "num_fds"), med(second, "num_fds")
        if fd1 > fd0 + FD_TOLERANCE:
            problems.append(f"open fds grew from {fd0:.0f} to {fd1:.0f} (medians of the halves)")
        w0, w1 = med(first, "num_waiting"), med(second, "num_waiting")
        if w1 > w0 + max(4.0, 0.5 * w0):
            problems.append(f"the waiting queue grew from {w0:.0f} to {w1:.0f} (medians of the halves)")
    return problems


def cmd_soak(args) -> int:
    import logging

    from pagedcore.benchmarks.machine import cpu_info, describe_cpu

    logging.getLogger("httpx").setLevel(logging.WARNING)   # one line per request would bury the samples
    soak = Soak(args)
    proc = soak.start_server()
    try:
        started = time.time()
        idle = asyncio.run(soak.run_load(proc.pid))
    finally:
        proc.terminate()
        try:
            code = proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        if soak.log is not subprocess.DEVNULL:
            soak.log.close()
    problems = verdict(soak.samples, idle, soak.tally, args.duration)
    if code != 0:
        problems.append(f"the server exited with {code} after SIGTERM")
    rss = [s.rss_bytes for s in soak.samples]
    result = {
        "passed": not problems, "problems": problems, "duration_s": args.duration, "concurrency": args.concurrency,
        "cpu": describe_cpu(cpu_info()), "loadavg_1min_end": os.getloadavg()[0], "started": started,
        "ok": soak.tally.ok, "aborted": soak.tally.aborted, "throttled": soak.tally.throttled,
        "timed_out": soak.tally.timed_out,
        "failures": soak.tally.failures, "rss_mib_min_max": [min(rss) / MIB, max(rss) / MIB], **idle,
        "samples": [asdict(s) for s in soak.samples],
    }
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(result, f, indent=1)
    print(f"soak {'PASSED' if not problems else 'FAILED'}: {args.duration:.0f} s at concurrency {args.concurrency} "
          f"on {result['cpu']} (1-min load {result['loadavg_1min_end']:.2f}, a shared machine); "
          f"completed {sum(soak.tally.ok.values())} {soak.tally.ok}, aborted {sum(soak.tally.aborted.values())}, "
          f"429 {soak.tally.throttled}, client timeouts {soak.tally.timed_out}; RSS {result['rss_mib_min_max'][0]:.0f}..{result['rss_mib_min_max'][1]:.0f} "
          f"MiB; idle fds {idle['idle_start']['num_fds']} -> {idle['idle_end']['num_fds']}, KV usage "
          f"{idle['idle_start']['kv_cache_usage']:.3f} -> {idle['idle_end']['kv_cache_usage']:.3f}")
    for p in problems:
        print("  problem:", p)
    return 0 if not problems else 1


def add_soak_parser(sub) -> None:
    p = sub.add_parser("soak", help="hold a server under mixed HTTP + gRPC load; fail on leaks, growth or 5xx")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load (default 60)")
    p.add_argument("--concurrency", type=int, default=32, help="clients busy at once (default 32)")
    p.add_argument("--max-tokens", type=int, default=16, help="most tokens a request asks for (default 16)")
    p.add_argument("--abort-fraction", type=float, default=0.15, help="share of requests that hang up mid-stream")
    p.add_argument("--grpc-fraction", type=float, default=0.3, help="share of requests over gRPC (0: HTTP only)")
    p.add_argument("--sample-interval", type=float, default=2.0, help="seconds between samples")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before a request counts as failed")
    p.add_argument("--kv-cache-memory", default="64MiB", help="the server's KV cache (small: preemption happens)")
    p.add_argument("--max-model-len", type=int, default=512, help="the server's --max-model-len")
    p.add_argument("--serve-args", default="", help="more `pagedcore serve` flags, one string")
    p.add_argument("--server-log", default=None, help="write the server's log here")
    p.add_argument("--seed", type=int, default=0, help="seed of the request mix")
    p.add_argument("--output-json", default=None, help="write the result and every sample here")
    p.set_defaults(func=cmd_soak)
