"""TraceRecorder: the engine's step records kept in a ring, fanned out to live subscribers and a JSONL file.

    engine thread:  EngineView step listener ─▶ on_step ─▶ StepTracer ─▶ record ─┬▶ ring (bounded)
                    AsyncLLMEngine.step_hooks ─▶ on_hook (aborts) ─▶ sync ───────┼▶ subscribers (SSE)
                                                                                  └▶ --trace-file (JSONL)
Everything the engine thread touches is under one lock, so a subscriber's first snapshot and the
records it receives afterwards join without a gap or an overlap.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import threading
import time

from pagedcore.simulator.kv_state import KVState
from pagedcore.simulator.trace import StepTracer

logger = logging.getLogger(__name__)

# The per-step numbers of the page's timeline, kept for subscribers that join late (state.js fromSummary).
SUMMARY_FIELDS = ("step", "time", "num_prefill_tokens", "num_decode_tokens", "num_seqs")


def summary(record: dict) -> list:
    kv = record.get("kv", {})
    spec = record.get("spec")
    generated = spec["num_generated_tokens"] if spec else \
        sum(1 for sid, n, c, kind, num_tokens in record.get("scheduled", ()) if num_tokens == c + n + 1)
    return [record[k] for k in SUMMARY_FIELDS] + [kv.get("usage", 0.0), len(record.get("preempted", ())),
                                                  len(record.get("finished", ())),
                                                  record.get("timing", {}).get("total"), generated]


class Subscription:
    """One live reader (an SSE response). Filled on the engine thread, drained on an event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_pending: int):
        self.loop = loop
        self.max_pending = max_pending
        self.pending: collections.deque[str] = collections.deque()
        self.resync = False        # fell too far behind: the next read starts again from a snapshot
        self.wakeup = asyncio.Event()

    def _push(self, line: str) -> None:   # under the recorder's lock
        if len(self.pending) >= self.max_pending:
            self.pending.clear()
            self.resync = True
        else:
            self.pending.append(line)
        try:
            self.loop.call_soon_threadsafe(self.wakeup.set)
        except RuntimeError:       # the reader's loop is gone
            pass


class TraceRecorder:
    def __init__(self, trace_file: str | None = None, ring_size: int = 4096, max_pending: int = 2048):
        self.trace_file = trace_file
        self.ring_size = ring_size
        self.max_pending = max_pending
        self.tracer: StepTracer | None = None
        self.ring: collections.deque[dict] = collections.deque()
        self._base: KVState | None = None     # the state just before the ring's oldest record
        self._subs: list[Subscription] = []
        self._lock = threading.Lock()
        self._file = None
        self.num_records = 0
        self.seconds_in_recorder = 0.0         # engine-thread time spent here (the cost of tracing)

    @property
    def attached(self) -> bool:
        return self.tracer is not None

    # -- wiring ------------------------------------------------------------------------------------------
    def attach(self, engine) -> TraceRecorder:
        """Listens to an LLMEngine, or to an AsyncLLMEngine (then aborts between steps are seen too).
        Call before the first request: the mirror starts from an empty cache."""
        view = getattr(engine, "engine", engine).view
        if view.scheduler.gpu_pool.num_used_blocks:
            raise RuntimeError("attach the TraceRecorder before the engine serves its first request")
        self.start(StepTracer(view.scheduler, view.request_of_seq, extra_config={"model": view.model_path}))
        view.add_step_listener(self.on_step)
        if hasattr(engine, "step_hooks"):
            engine.step_hooks.append(self.on_hook)
        return self

    def start(self, tracer: StepTracer) -> None:
        with self._lock:
            self.tracer = tracer
            self._base = KVState.from_snapshot(tracer.state.snapshot())
            if self.trace_file:
                # Line-buffered: a reader (the page, a test) sees every step at once, even when the
                # engine then goes idle; one write per step is small beside a model step.
                self._file = open(self.trace_file, "w", encoding="utf-8", buffering=1)
                self._file.write(json.dumps(tracer.state.snapshot(), separators=(",", ":")) + "\n")
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    # -- engine thread ---------------------------------------------------------------------------------------
    def on_step(self, scheduler_output, update_result, timing: dict | None) -> None:
        t0 = time.perf_counter()
        with self._lock:
            self._publish(self.tracer.on_step(scheduler_output, update_result, timing))
        self.seconds_in_recorder += time.perf_counter() - t0

    def on_hook(self, outputs, timing: dict | None) -> None:
        """AsyncLLMEngine step hook: timing None means a request ended outside a step (abort)."""
        if timing is not None or self.tracer is None:
            return
        with self._lock:
            record = self.tracer.sync()
            if record is not None:
                self._publish(record)

    def _publish(self, record: dict) -> None:   # under the lock
        self.num_records += 1
        self.ring.append(record)
        if len(self.ring) > self.ring_size:
            self._base.apply(self.ring.popleft())
        if not self._subs and self._file is None:
            return
        line = json.dumps(record, separators=(",", ":"))
        for sub in self._subs:
            sub._push(line)
        if self._file is not None:
            self._file.write(line + "\n")

    # -- readers (any thread) -----------------------------------------------------------------------------------
    def subscribe(self, loop: asyncio.AbstractEventLoop) -> tuple[Subscription, dict]:
        """A new subscription and the snapshot it starts from (with the ring's timeline summary)."""
        sub = Subscription(loop, self.max_pending)
        with self._lock:
            self._subs.append(sub)
            return sub, self._snapshot_locked()

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subs:
                self._subs.remove(sub)

    def drain(self, sub: Subscription) -> list[str]:
        """The lines waiting for this subscriber; a fresh snapshot first if it fell behind."""
        sub.wakeup.clear()
        with self._lock:
            lines = list(sub.pending)
            sub.pending.clear()
            if sub.resync:
                sub.resync = False
                return [json.dumps(self._snapshot_locked(), separators=(",", ":"))]
            return lines

    def snapshot(self) -> dict:
        with self._lock:
            return self._snapshot_locked()

    def _snapshot_locked(self) -> dict:
        snap = self.tracer.state.snapshot()
        snap["history"] = [summary(r) for r in self.ring if r["kind"] == "step"]
        return snap

    def jsonl(self) -> str:
        """The ring as a replayable trace: the state before its oldest record, then the records."""
        with self._lock:
            lines = [self._base.snapshot()] + list(self.ring)
        return "".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines)
