"""What the simulator's step trace costs a serving engine: `pagedcore serve` with the trace (the default)
against `pagedcore serve --disable-trace`, through HTTP, on the fixed workload, alternated in one run.

    .venv/bin/python bench/bench_trace.py                 # 2 rounds of off / on / watch: ~9 min on a quiet 2-core CPU
    .venv/bin/python bench/bench_trace.py --rounds 3 --modes off on --output-json trace_cost.json

Modes:  off       --disable-trace
        on        the default: the C++ events, the StepTracer's record per step, the ring of 4096 records
        watch     on, plus a reader of GET /simulator/events (what an open simulator page adds: the
                  record serialised to JSON once per step on the engine thread, the SSE stream)
Each server is started fresh for its run (same flags otherwise), so the runs differ in the trace only;
alternating the modes spreads the machine's drift over all of them. Besides throughput, the server
reports the engine-thread seconds spent in the recorder (GET /simulator/info trace_cost): that figure
is the trace's cost itself, far less noisy than a difference of two throughputs on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import httpx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKLOAD = os.path.join(ROOT, "bench", "workloads", "workload_n128_seed0.json")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip() + f" ({os.cpu_count()} cores)"
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def load_average() -> float:
    return os.getloadavg()[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, mode: str, extra: list[str]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"bench-trace-{mode}-", suffix=".log", delete=False)
        cmd = [os.path.join(os.path.dirname(sys.executable), "pagedcore"), "serve", "--port", str(self.port),
               "--grpc-port", "0", "--uvicorn-log-level", "warning", "--kv-cache-commit", "startup", *extra]
        if mode == "off":
            cmd.append("--disable-trace")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT)

    def wait_ready(self, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited: see {self.log.name}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"the server was not ready in {timeout_s} s: see {self.log.name}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)


def watch_events(url: str, stop: threading.Event, counts: dict) -> None:
    """An SSE reader like the page: reads every record until told to stop."""
    try:
        with httpx.stream("GET", url + "/simulator/events", timeout=httpx.Timeout(None)) as resp:
            for line in resp.iter_lines():
                if line.startswith("data:"):
                    counts["records"] = counts.get("records", 0) + 1
                if stop.is_set():
                    return
    except httpx.HTTPError:
        pass


def one_run(mode: str, extra: list[str], workload: str, num_requests: int | None) -> dict:
    from pagedcore.benchmarks import workloads
    from pagedcore.benchmarks.serve import discover_model, run_at_rate

    server = Server(mode, extra)
    try:
        server.wait_ready()
        requests = workloads.make_workload("file", 49152, num_requests, 0, workload)
        model = discover_model(server.url, None)
        stop, counts, reader = threading.Event(), {}, None
        if mode == "watch":
            reader = threading.Thread(target=watch_events, args=(server.url, stop, counts), daemon=True)
            reader.start()
        load0 = load_average()
        run = asyncio.run(run_at_rate(server.url, model, requests, float("inf"), None, 0, 1800.0, None))
        info = httpx.get(server.url + "/simulator/info", timeout=10).json()
        stop.set()
        if run["failed"]:
            raise RuntimeError(f"{run['failed']} requests failed: {run['errors']}")
        cost = info.get("trace_cost") or {}
        return {"mode": mode, "output_tok_s": run["output_token_throughput"], "duration_s": run["duration_seconds"],
                "output_tokens": run["output_tokens"], "trace_seconds": cost.get("seconds", 0.0),
                "num_records": cost.get("num_records", 0), "sse_records_read": counts.get("records", 0),
                "loadavg_1min_before": load0, "loadavg_1min_after": load_average()}
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="rounds of all modes, alternated (default 2)")
    parser.add_argument("--modes", nargs="+", default=["off", "on", "watch"], choices=["off", "on", "watch"])
    parser.add_argument("--workload", default=WORKLOAD, help="the fixed workload (default: %(default)s)")
    parser.add_argument("--num-requests", type=int, default=None,
                        help="the first N requests of the workload (default: all 128); a shorter run on a busy machine")
    parser.add_argument("--output-json", default=None)
    parser.add_argument("serve_args", nargs="*", help="extra `pagedcore serve` flags, after --")
    args = parser.parse_args()
    print(f"bench_trace: {cpu_name()}, workload {os.path.relpath(args.workload, ROOT)}"
          f"{f' (first {args.num_requests} requests)' if args.num_requests else ''}, modes {args.modes} x "
          f"{args.rounds} rounds, serve flags {args.serve_args or '(defaults)'}", flush=True)
    runs = []
    for r in range(args.rounds):
        modes = args.modes if r % 2 == 0 else list(reversed(args.modes))   # ABC CBA: drift cancels in pairs
        for mode in modes:
            run = one_run(mode, args.serve_args, args.workload, args.num_requests)
            runs.append(run)
            share = run["trace_seconds"] / run["duration_s"] * 100
            print(f"  round {r} {mode:5s}: {run['output_tok_s']:7.1f} output tok/s ({run['duration_s']:.1f} s), "
                  f"engine thread in the recorder {run['trace_seconds']:.3f} s over {run['num_records']} steps "
                  f"({share:.2f}% of the run), load avg {run['loadavg_1min_before']:.2f} -> "
                  f"{run['loadavg_1min_after']:.2f}", flush=True)
    summary = {}
    for mode in args.modes:
        mine = [x for x in runs if x["mode"] == mode]
        summary[mode] = {"output_tok_s_mean": statistics.mean(x["output_tok_s"] for x in mine),
                         "trace_share_of_run": statistics.mean(x["trace_seconds"] / x["duration_s"] for x in mine),
                         "us_per_step": statistics.mean(x["trace_seconds"] / max(1, x["num_records"]) * 1e6
                                                        for x in mine)}
    print(f"summary ({cpu_name()}, 1-min load average now {load_average():.2f}; a shared machine is noisy):")
    base = summary.get("off", {}).get("output_tok_s_mean")
    for mode, s in summary.items():
        rel = f"{(s['output_tok_s_mean'] / base - 1) * 100:+.2f}% vs off" if base and mode != "off" else ""
        print(f"  {mode:5s} {s['output_tok_s_mean']:7.1f} output tok/s {rel:>14s}   recorder "
              f"{s['us_per_step']:.0f} us/step = {s['trace_share_of_run'] * 100:.2f}% of the engine's time")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"cpu": cpu_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S"), "runs": runs,
                       "summary": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
