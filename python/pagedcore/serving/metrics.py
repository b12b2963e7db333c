"""Prometheus metrics, vLLM's names under `pagedcore:`, in a registry of their own.

Two sources, so that the HTTP thread never touches the engine:
  - gauges and the scheduler's cumulative counters are read at scrape time from the snapshot the
    engine thread publishes after each step (running / waiting / swapped, KV usage, prefix cache,
    preemptions);
  - token counters and latency histograms are fed on the engine thread by a step hook, from the
    step's outputs and their RequestMetrics;
  - structured output: the grammar cache's hit / miss counts are read at scrape time, and each compile's
    time is observed by the thread that compiled (a front end's worker, or the engine's);
  - the KV cache's commit (engine/host_memory.py commit_totals), read at scrape time: bytes made resident
    so far against bytes to commit, while `--kv-cache-commit background` brings the cache in (this
    process's caches: not emitted where the model runs in worker processes, mp / Ray).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from pagedcore.engine import host_memory
from pagedcore.outputs import RequestOutput
from pagedcore.serving.async_engine import EngineSnapshot

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
P = "pagedcore:"

# Bucket edges as vLLM's, so dashboards built for it read ours unchanged.
_TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
         40.0, 80.0, 160.0, 640.0, 2560.0]
_ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
_COMPILE = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]
_LATENCY = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
            480.0, 960.0, 1920.0, 7680.0]


def _tokens_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's build_1_2_5_buckets)."""
    out, exponent = [], 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10 ** exponent
            if value > max_value:
                return out
            out.append(value)
        exponent += 1


@dataclass
class _Live:
    """Per-request bookkeeping between steps (engine thread only)."""

    last_token_time: float | None = None


class _SnapshotCollector:
    """Gauges and scheduler counters, read from the latest engine snapshot at scrape time."""

    def __init__(self, snapshot: Callable[[], EngineSnapshot | None], model_name: str):
        self.snapshot = snapshot
        self.labels = [model_name]

    def collect(self):
        s = self.snapshot() or EngineSnapshot()
        for name, doc, value in (
                ("num_requests_running", "Requests in the running batch.", s.num_running),
                ("num_requests_waiting", "Requests waiting to be scheduled.", s.num_waiting),
                ("num_requests_swapped", "Requests swapped out to CPU memory.", s.num_swapped),
                ("kv_cache_usage_perc", "Fraction of KV cache blocks in use (1 = full).", s.kv_cache_usage)):
            g = GaugeMetricFamily(P + name, doc, labels=["model_name"])
            g.add_metric(self.labels, value)
            yield g
        for name, doc, value in (
                ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", s.prefix_query_tokens),
                ("prefix_cache_hits", "Prompt tokens found in the prefix cache.", s.prefix_hit_tokens),
                ("num_preemptions", "Sequences preempted (recompute or swap).", s.num_preemptions)):
            c = CounterMetricFamily(P + name, doc, labels=["model_name"])
            c.add_metric(self.labels, value)
            yield c


class _KVCommitCollector:
    """The KV cache's commit progress (not vLLM's: its CPU cache is committed before serving starts)."""

    def __init__(self, model_name: str):
        self.labels = [model_name]

    def collect(self):
        committed, target = host_memory.commit_totals()
        if target == 0:      # the caches live in worker processes (mp / Ray) or none was committed
            return
        for name, doc, value in (
                ("kv_cache_committed_bytes", "KV cache bytes made resident so far (--kv-cache-commit).", committed),
                ("kv_cache_commit_target_bytes", "KV cache bytes to make resident.", target)):
            g = GaugeMetricFamily(P + name, doc, labels=["model_name"])
            g.add_metric(self.labels, value)
            yield g


class _GrammarCacheCollector:
    """The grammar cache's hits and misses (GrammarCache counts them), read at scrape time."""

    def __init__(self, grammars, model_name: str):
        self.grammars = grammars
        self.labels = [model_name]

    def collect(self):
        for name, doc, value in (
                ("structured_output_cache_hits", "Constraints found compiled in the grammar cache.",
                 self.grammars.num_hits),
                ("structured_output_cache_misses", "Constraints compiled (not in the grammar cache).",
                 self.grammars.num_misses)):
            c = CounterMetricFamily(P + name, doc, labels=["model_name"])
            c.add_metric(self.labels, value)
            yield c


class _LoRACollector:
    """vLLM's lora_requests_info: a gauge (value: scrape time) whose labels name the adapters of the
    latest step (running) and those with unfinished requests outside it (waiting)."""

    def __init__(self, lora_manager):
        self.lora_manager = lora_manager

    def collect(self):
        running, waiting = self.lora_manager.adapter_activity()
        g = GaugeMetricFamily(P + "lora_requests_info", "Running stats on LoRA requests.",
                              labels=["max_lora", "waiting_lora_adapters", "running_lora_adapters"])
        g.add_metric([str(self.lora_manager.max_loras), ",".join(waiting), ",".join(running)], time.time())
        yield g


class ServerMetrics:
    def __init__(self, model_name: str, snapshot: Callable[[], EngineSnapshot | None], max_model_len: int):
        disable_created_metrics()   # no *_created series: vLLM leaves them out too, they double the output
        self.registry = CollectorRegistry()
        self.registry.register(_SnapshotCollector(snapshot, model_name))
        self.registry.register(_KVCommitCollector(model_name))
        labels = {"labelnames": ["model_name"], "registry": self.registry}
        tokens = _tokens_buckets(max_model_len)

        def counter(name, doc, extra=()):
            return Counter(P + name, doc, labelnames=["model_name", *extra], registry=self.registry)

        def histogram(name, doc, buckets):
            return Histogram(P + name, doc, buckets=buckets, **labels).labels(model_name)

        self.prompt_tokens = counter("prompt_tokens", "Prefilled prompt tokens.").labels(model_name)
        self.generation_tokens = counter("generation_tokens", "Generated tokens.").labels(model_name)
        self._success = counter("request_success", "Finished requests, by finish reason.", ["finished_reason"])
        self._model_name = model_name
        self.ttft = histogram("time_to_first_token_seconds", "Arrival to first token.", _TTFT)
        self.itl = histogram("inter_token_latency_seconds", "Time between a request's successive tokens.", _ITL)
        self.tpot = histogram("time_per_output_token_seconds", "Mean time per output token after the first, "
                              "per request.", _ITL)
        self.e2e = histogram("e2e_request_latency_seconds", "Arrival to finish.", _LATENCY)
        self.queue_time = histogram("request_queue_time_seconds", "Arrival to first scheduled.", _LATENCY)
        self.iteration_tokens = histogram("iteration_tokens_total", "Tokens scheduled per engine step.",
                                          [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384])
        self.request_prompt_tokens = histogram("request_prompt_tokens", "Prompt tokens per request.", tokens)
        self.request_generation_tokens = histogram("request_generation_tokens", "Generated tokens per request.",
                                                   tokens)
        self.constraint_compile_time = histogram("structured_output_compile_time_seconds",
                                                 "Time to compile a constraint that compiled (cache misses).",
                                                 _COMPILE)
        # Speculative decoding (vLLM's spec_decode counters), fed from the step record (spec_decode/stats.py).
        self.spec_num_drafts = counter("spec_decode_num_drafts", "Sequences that verified drafts, summed over steps.").labels(model_name)
        self.spec_num_draft_tokens = counter("spec_decode_num_draft_tokens", "Draft tokens verified.").labels(model_name)
        self.spec_num_accepted_tokens = counter("spec_decode_num_accepted_tokens", "Draft tokens accepted.").labels(model_name)
        self.spec_accepted_per_pos = counter("spec_decode_num_accepted_tokens_per_pos",
                                             "Draft tokens accepted, by draft position.", ["position"])
        self._live: dict[str, _Live] = {}

    def watch_grammars(self, grammars) -> None:
        """Exports a GrammarCache's hits, misses and compile times (once, when the engine is attached)."""
        grammars.compile_listeners.append(self.constraint_compile_time.observe)
        self.registry.register(_GrammarCacheCollector(grammars, self._model_name))

    def watch_lora(self, lora_manager) -> None:
        """Exports lora_requests_info for a LoRAManager (once, when the engine is attached)."""
        self.registry.register(_LoRACollector(lora_manager))

    def on_step(self, outputs: list[RequestOutput], timing: dict | None) -> None:
        """The async engine's step hook (engine thread): delta outputs of one step, or ([aborted], None)."""
        if timing is not None:
            self.iteration_tokens.observe(timing["num_tokens"])
            if timing.get("num_drafts"):
                self._on_spec_step(timing)
        for out in outputs:
            m = out.metrics
            live = self._live.get(out.request_id)
            if live is None:          # the request's first output: its prefill is done
                live = self._live[out.request_id] = _Live()
                self.prompt_tokens.inc(len(out.prompt_token_ids))
                if m is not None and m.time_in_queue is not None:
                    self.queue_time.observe(m.time_in_queue)
                if m is not None and m.time_to_first_token is not None:
                    self.ttft.observe(m.time_to_first_token)
            new_tokens = sum(len(c.token_ids) for c in out.outputs)
            self.generation_tokens.inc(new_tokens)
            if m is not None and new_tokens and m.last_token_time is not None:
                if live.last_token_time is not None and m.last_token_time > live.last_token_time:
                    self.itl.observe(m.last_token_time - live.last_token_time)
                live.last_token_time = m.last_token_time
            if out.finished:
                self._finish(out)

    def _on_spec_step(self, timing: dict) -> None:
        self.spec_num_drafts.inc(timing["num_drafts"])
        self.spec_num_draft_tokens.inc(timing["num_draft_tokens"])
        self.spec_num_accepted_tokens.inc(timing["num_accepted_tokens"])
        for pos, n in enumerate(timing["num_accepted_tokens_per_pos"]):
            self.spec_accepted_per_pos.labels(self._model_name, str(pos)).inc(n)

    def _finish(self, out: RequestOutput) -> None:
        self._live.pop(out.request_id, None)
        for c in out.outputs:
            self._success.labels(self._model_name, c.finish_reason or "abort").inc()
        m = out.metrics
        self.request_prompt_tokens.observe(len(out.prompt_token_ids))
        if m is None:
            return
        self.request_generation_tokens.observe(m.num_generation_tokens)
        if m.e2e_latency is not None:
            self.e2e.observe(m.e2e_latency)
        if m.time_per_output_token is not None:
            self.tpot.observe(m.time_per_output_token)

    def render(self) -> bytes:
        return generate_latest(self.registry)
