"""Model-free simulation: the real C++ scheduler and block pool, fake sampled tokens, a cost model's clock.

    arrivals ─▶ Scheduler.add_sequence ─▶ schedule() ─▶ clock += CostModel(step) ─▶ update(fake ids)
Everything the scheduler decides (admission, chunking, prefix hits, preemption, swap) is the engine's
own code; only the model is replaced by the clock. Static batching is emulated on top: a batch is
admitted only when the previous one has finished, and (as static batching really does) a finished
request's row keeps costing a padded token per step until its batch ends.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from pagedcore import _core
from pagedcore.simulator.cost_model import DEFAULT_COST_MODEL, CostModel
from pagedcore.simulator.workload import Request

FAKE_TOKEN = 7


@dataclass
class SimConfig:
    """The scheduler knobs of one simulated policy (SchedulerConfig's names) plus how it batches."""

    num_gpu_blocks: int = 2048
    block_size: int = 16
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 128
    max_model_len: int = 2048
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    preemption_mode: str = "recompute"     # recompute | swap
    num_cpu_blocks: int = 0                # swap space; 0 with swap = as many as num_gpu_blocks
    batching: str = "continuous"           # continuous | static

    def __post_init__(self):
        if self.batching not in ("continuous", "static"):
            raise ValueError(f"SimConfig.batching must be 'continuous' or 'static', got {self.batching!r}")
        if self.preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"SimConfig.preemption_mode must be 'recompute' or 'swap', got {self.preemption_mode!r}")

    def scheduler_config(self, enable_trace: bool = False) -> _core.SchedulerConfig:
        swap = self.preemption_mode == "swap"
        budget = self.max_num_batched_tokens
        if not self.enable_chunked_prefill:   # as EngineConfig does: a whole prompt must fit one step
            budget = max(budget, self.max_model_len)
        return _core.SchedulerConfig(
            num_gpu_blocks=self.num_gpu_blocks, block_size=self.block_size, max_num_batched_tokens=budget,
            num_cpu_blocks=(self.num_cpu_blocks or self.num_gpu_blocks) if swap else 0,
            max_num_seqs=self.max_num_seqs, max_model_len=self.max_model_len,
            enable_prefix_caching=self.enable_prefix_caching, enable_chunked_prefill=self.enable_chunked_prefill,
            preemption_mode=_core.PreemptionMode.SWAP if swap else _core.PreemptionMode.RECOMPUTE,
            enable_trace=enable_trace)


# Named policies: overrides of the base SimConfig. "block-size-N" keeps the KV memory (blocks x size).
POLICIES = {
    "continuous": {},
    "static": {"batching": "static"},
    "swap": {"preemption_mode": "swap"},
    "no-prefix-caching": {"enable_prefix_caching": False},
    "no-chunked-prefill": {"enable_chunked_prefill": False},
}
DEFAULT_POLICIES = ("continuous", "static", "swap", "no-prefix-caching", "no-chunked-prefill",
                    "block-size-8", "block-size-32")


def policy_config(base: SimConfig, name: str) -> SimConfig:
    if name.startswith("block-size-"):
        size = int(name.rsplit("-", 1)[1])
        return dataclasses.replace(base, block_size=size,
                                   num_gpu_blocks=max(1, base.num_gpu_blocks * base.block_size // size))
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)} or block-size-N")
    return dataclasses.replace(base, **POLICIES[name])


@dataclass
class SimResult:
    policy: str
    config: dict
    metrics: dict
    series: dict                 # per-step arrays (downsampled) for the page's charts
    records: list | None = None  # a snapshot then StepTracer records, when traced (a replayable trace)


def _percentiles(values: np.ndarray, scale: float = 1e3) -> dict:
    values = values[~np.isnan(values)]
    if not len(values):
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(values, [50, 90, 99]) * scale
    return {"mean": round(float(values.mean()) * scale, 3), "p50": round(float(p50), 3),
            "p90": round(float(p90), 3), "p99": round(float(p99), 3)}


def simulate(requests: list[Request], config: SimConfig, cost: CostModel = DEFAULT_COST_MODEL,
             policy: str = "custom", trace_steps: int = 0, series_points: int = 400) -> SimResult:
    """Runs every request to completion; trace_steps > 0 also keeps StepTracer records of the first steps."""
    sched = _core.Scheduler(config.scheduler_config(enable_trace=trace_steps > 0))
    n, bs, static = len(requests), config.block_size, config.batching == "static"
    order = sorted(range(n), key=lambda i: requests[i].arrival)
    arrival = np.array([r.arrival for r in requests])
    out_len = np.array([r.max_tokens for r in requests])
    # What a server without paging reserves per request: a contiguous max_model_len slab.
    reserve = np.full(n, config.max_model_len)
    final_len = np.array([len(r.prompt_token_ids) + r.max_tokens for r in requests])
    first_token, finish = np.full(n, np.nan), np.full(n, np.nan)
    rejected = np.zeros(n, dtype=bool)
    tracer, records = None, []
    if trace_steps:
        from pagedcore.simulator.trace import StepTracer
        tracer = StepTracer(sched, resolve=lambda sid: (requests[sid].request_id, float(arrival[sid])),
                            extra_config={"model": f"simulation: {policy}"})
        records.append(tracer.state.snapshot())   # a trace starts from the state it applies to
    cols = {k: [] for k in ("time", "dt", "num_tokens", "num_prefill_tokens", "num_decode_tokens", "num_seqs",
                            "num_used_blocks", "waste_slots", "contiguous_waste", "contiguous_reserved",
                            "num_padded_rows", "num_sampled")}
    clock, nxt = 0.0, 0
    batch: list[int] = []                  # static batching: the batch in flight
    num_done_in_batch = done_context = 0   # its finished (padded) rows and the context they still read
    num_gpu_blocks = config.num_gpu_blocks

    def add(i: int) -> bool:
        try:
            sched.add_sequence(i, requests[i].prompt_token_ids, max_tokens=requests[i].max_tokens, ignore_eos=True)
            return True
        except ValueError:                 # can never fit: the engine refuses it, so do we
            rejected[i] = True
            return False

    while nxt < n or sched.has_unfinished():
        if static:
            if not sched.has_unfinished():
                batch, num_done_in_batch, done_context = [], 0, 0
                while nxt < n and arrival[order[nxt]] <= clock and len(batch) < config.max_num_seqs:
                    if add(order[nxt]):
                        batch.append(order[nxt])
                    nxt += 1
        else:
            while nxt < n and arrival[order[nxt]] <= clock:
                add(order[nxt])
                nxt += 1
        if not sched.has_unfinished():
            if nxt < n:
                clock = max(clock, float(arrival[order[nxt]]))   # idle until the next arrival
            continue
        out = sched.schedule()
        if out.num_seqs == 0:
            raise RuntimeError(f"the scheduler made no progress at step {out.step_id} with "
                               f"{sched.stats().num_waiting} waiting; raise num_gpu_blocks or max_num_batched_tokens")
        seq_lens = out.seq_lens
        num_tokens, num_ctx, num_seqs = out.num_tokens, int(seq_lens.sum()), out.num_seqs
        pad = 0
        if static:   # finished rows of the batch are still computed (padding) until it ends
            pad = num_done_in_batch
            num_ctx += done_context
        num_swapped = len(out.blocks_to_swap_in) + len(out.blocks_to_swap_out)
        dt = cost.step_time(num_tokens + pad, num_ctx, num_seqs + pad, num_swapped)
        clock += dt
        sampled = out.sample_seq_ids
        res = sched.update(np.full(len(sampled), FAKE_TOKEN, dtype=np.int64))
        new = sampled[np.isnan(first_token[sampled])]
        first_token[new] = clock
        finished = res.finished_seq_ids
        finish[finished] = clock
        num_done_in_batch += len(finished)
        done_context += int(final_len[finished].sum())
        stats_free = sched.gpu_pool.num_free_blocks
        ids = out.seq_ids
        for k, v in (("time", clock), ("dt", dt), ("num_tokens", num_tokens), ("num_seqs", num_seqs),
                     ("num_prefill_tokens", out.num_prefill_tokens), ("num_decode_tokens", out.num_decode_tokens),
                     ("num_used_blocks", num_gpu_blocks - stats_free), ("waste_slots", int(((-seq_lens) % bs).sum())),
                     ("contiguous_waste", int((reserve[ids] - seq_lens).sum())),
                     ("contiguous_reserved", int(reserve[ids].sum())), ("num_padded_rows", pad),
                     ("num_sampled", len(sampled))):
            cols[k].append(v)
        if tracer is not None and out.step_id <= trace_steps:
            records.append(tracer.on_step(out, res, {"total": dt}, now=clock))
    stats = sched.stats()
    metrics = _metrics(config, cols, arrival, first_token, finish, out_len, rejected, stats, requests)
    return SimResult(policy, dataclasses.asdict(config), metrics, _series(cols, config, series_points),
                     records if tracer is not None else None)


def _metrics(config, cols, arrival, first_token, finish, out_len, rejected, stats, requests) -> dict:
    c = {k: np.asarray(v, dtype=np.float64) for k, v in cols.items()}
    done = ~np.isnan(finish)
    duration = float(np.nanmax(finish) - arrival.min()) if done.any() else 0.0
    busy = float(c["dt"].sum())
    w = c["dt"] / busy if busy else c["dt"]
    used_slots = c["num_used_blocks"] * config.block_size
    tpot = np.where(out_len > 1, (finish - first_token) / np.maximum(out_len - 1, 1), np.nan)
    num_output = int(out_len[done].sum())
    num_prompt = int(sum(len(r.prompt_token_ids) for r, d in zip(requests, done) if d))
    return {
        "num_requests": int(done.sum()), "num_rejected": int(rejected.sum()), "num_steps": int(len(c["dt"])),
        "duration_s": round(duration, 4),
        "throughput_tokens_per_s": round(num_output / duration, 2) if duration else 0.0,
        "throughput_total_tokens_per_s": round((num_output + num_prompt) / duration, 2) if duration else 0.0,
        "requests_per_s": round(int(done.sum()) / duration, 3) if duration else 0.0,
        "busy_fraction": round(busy / duration, 4) if duration else 0.0,
        # Time-weighted means over steps: how full the batch, the budget and the cache were.
        "batch_occupancy": round(float((w * c["num_seqs"]).sum()) / config.max_num_seqs, 4),
        "padded_rows_fraction": round(float((w * c["num_padded_rows"]).sum()) / config.max_num_seqs, 4),
        "token_budget_use": round(float((w * c["num_tokens"]).sum()) / config.scheduler_config().max_num_batched_tokens, 4),
        "kv_usage": round(float((w * c["num_used_blocks"]).sum()) / config.num_gpu_blocks, 4),
        # Allocated but unwritten slots (the tail of each sequence's last block), and what reserving
        # prompt + max_tokens contiguously, as pre-paging servers did, would leave unused.
        "kv_waste": round(float(c["waste_slots"].sum() / max(used_slots.sum(), 1)), 4),
        "kv_waste_contiguous": round(float(c["contiguous_waste"].sum() / max(c["contiguous_reserved"].sum(), 1)), 4),
        "num_prefill_tokens": int(c["num_prefill_tokens"].sum()),
        "num_decode_tokens": int(c["num_decode_tokens"].sum()),
        "num_sampled_tokens": int(c["num_sampled"].sum()),   # = output tokens: one per sampled row
        "prefix_hit_rate": round(stats.prefix_hit_tokens / stats.prefix_query_tokens, 4) if stats.prefix_query_tokens else 0.0,
        "num_preemptions": stats.num_preemptions, "num_evictions": stats.num_evictions,
        "ttft_ms": _percentiles(first_token[done] - arrival[done]),
        "tpot_ms": _percentiles(tpot[done]),
        "e2e_ms": _percentiles(finish[done] - arrival[done]),
    }


def _series(cols: dict, config: SimConfig, points: int) -> dict:
    """Per-step columns bucketed to at most `points` entries (means), for charts."""
    n = len(cols["time"])
    edges = np.linspace(0, n, min(points, n) + 1).astype(int) if n else np.array([0])
    out = {}
    for k in ("time", "num_prefill_tokens", "num_decode_tokens", "num_seqs", "num_used_blocks"):
        v = np.asarray(cols[k], dtype=np.float64)
        out[k] = [round(float(v[a:b].mean()), 4) for a, b in zip(edges[:-1], edges[1:]) if b > a]
    out["kv_usage"] = [round(u / config.num_gpu_blocks, 4) for u in out.pop("num_used_blocks")]
    return out


def compare(requests: list[Request], base: SimConfig, policies=DEFAULT_POLICIES,
            cost: CostModel = DEFAULT_COST_MODEL) -> list[SimResult]:
    return [simulate(requests, policy_config(base, name), cost, policy=name) for name in policies]
