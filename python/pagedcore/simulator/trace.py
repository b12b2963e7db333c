"""StepTracer: one JSON-able record per engine step, built from the C++ scheduler's trace events.

    schedule() events ─┐                       ┌─▶ record: what happened (scheduled tokens, blocks
    block_tables ──────┼─▶ StepTracer.on_step ─┤     allocated/freed/shared/copied/swapped, hits,
    update() events ───┤   (KVState mirror)    │     evictions, preemptions, finished with TTFT/TPOT)
    timing (listener) ─┘                       └─▶ record: what the state is now (changed blocks,
                                                     tables, queues), absolute values (kv_state.py)
Engine-agnostic: the live engine (recorder.py) and the model-free simulation both feed it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pagedcore.simulator.kv_state import (FINISH_REASONS, NO_OWNER, PREEMPTION_MODES, QUEUES, SEQ_STATUS,
                                          KVState, new_seq)

# pagedcore._core.TraceEventType values (cpp/core/step_trace.h says what a and b hold)
ALLOCATE, FREE, PREFIX_HIT, COPY_ON_WRITE, SWAP_OUT, SWAP_IN, EVICT, PREEMPT, QUEUE_MOVE, FINISH, REJECT, \
    SCHEDULE, FORK, CACHE_REGISTER = range(14)
PREFILL, DECODE, RECOMPUTE, VERIFY = 0, 1, 2, 3   # kinds of a scheduled chunk (VERIFY: a token + its drafts)
EVENT_LISTS = ("allocated", "freed", "prefix_hits", "cow", "swapped_out", "swapped_in", "evicted",
               "registered", "forks", "rejected")

OPTIONAL_CONFIG_FIELDS = ("max_loras", "num_speculative_tokens", "tensor_parallel_size", "pipeline_parallel_size")

# seq_id -> (request_id, arrival time on the tracer's clock[, extras]), or None when unknown. `extras`, a
# dict, rides on the sequence's record as it is (adapters: {"lora_name": ...}); the page shows what it finds.
Resolver = Callable[[int], "tuple | None"]


def scheduler_config_dict(cfg) -> dict:
    """The SchedulerConfig fields the page shows, under the engine's names."""
    return {"num_gpu_blocks": cfg.num_gpu_blocks, "num_cpu_blocks": cfg.num_cpu_blocks,
            "block_size": cfg.block_size, "max_num_batched_tokens": cfg.max_num_batched_tokens,
            "max_num_seqs": cfg.max_num_seqs, "max_model_len": cfg.max_model_len,
            "enable_prefix_caching": cfg.enable_prefix_caching, "enable_chunked_prefill": cfg.enable_chunked_prefill,
            "preemption_mode": cfg.preemption_mode.name.lower(), "policy": cfg.policy.name.lower(),
            # fields of features that land in the scheduler's config (the page shows the ones present)
            **{k: getattr(cfg, k) for k in OPTIONAL_CONFIG_FIELDS if getattr(cfg, k, None)}}


def table_delta(old: list[int], new: list[int]) -> list[int]:
    """[p, *new[p:]] with p the length of the common prefix: a growing table sends its new blocks only."""
    if new[:len(old)] == old:                 # the common case, compared in C: the table grew at its end
        return [len(old)] + new[len(old):]
    p = 0
    for x, y in zip(old, new):
        if x != y:
            break
        p += 1
    return [p] + new[p:]


def queue_delta(old: list[int], new: list[int]) -> dict:
    """{"remove": ids, "front": ids, "add": ids} when new = front + (old without removed) + add, as
    queues move (admission from the front, finishing anywhere, arrivals at the back, a preempted
    sequence put back at the front); else {"ids": new} (e.g. priority order)."""
    keep = set(new)
    kept = [x for x in old if x in keep]
    j = new.index(kept[0]) if kept else 0
    if new[j:j + len(kept)] == kept:
        return {"remove": [x for x in old if x not in keep], "front": new[:j], "add": new[j + len(kept):]}
    return {"ids": new}


class _Step:
    """What one record accumulates while its events are read."""

    def __init__(self):
        self.blocks: set[int] = set()          # GPU blocks whose state changed
        self.cpu_blocks: set[int] = set()
        self.seqs: set[int] = set()            # sequences whose status/meta changed (or ended)
        self.events = {name: [] for name in EVENT_LISTS}
        self.preempted: list = []
        self.finished: list = []
        self.swap_tables: dict[int, list[int]] = {}
        self.allocating: set[int] = set()      # sequences that were given blocks (their tables changed)


class StepTracer:
    def __init__(self, scheduler, resolve: Resolver | None = None, clock: Callable[[], float] = time.time,
                 extra_config: dict | None = None):
        if not scheduler.config.enable_trace:
            raise ValueError("the scheduler was built without tracing; set SchedulerConfig(enable_trace=True) "
                             "(EngineConfig.enable_trace, or `pagedcore serve --enable-trace`)")
        self.scheduler = scheduler
        self.resolve = resolve
        self.clock = clock
        self.state = KVState({**scheduler_config_dict(scheduler.config), **(extra_config or {})})

    # -- one engine step ------------------------------------------------------------------------------
    def on_step(self, out, result, timing: dict | None = None, now: float | None = None) -> dict:
        now = self.clock() if now is None else now
        st, acc = self.state, _Step()
        self._read_events(out.events.tolist(), acc, now)

        # Tables after allocation, prefix hits and CoW: the scheduler hands them to the runner anyway.
        scheduled, tables = [], {}
        bt = out.block_tables                       # [num_seqs, max_num_blocks_per_seq], -1 padded
        lengths = (bt >= 0).sum(axis=1).tolist() if bt.size else [0] * out.num_seqs
        # Speculative decoding: drafts are appended between steps without events; a sequence with k
        # drafts is scheduled with its last k + 1 tokens and yields k + 1 logits rows.
        num_drafts = getattr(out, "num_draft_tokens", 0)
        rows = out.num_logits_rows.tolist() if num_drafts else None      # [num_seqs]
        drafted = {}                                # seq_id -> k, for the rows that verify drafts
        for i, (sid, n, c) in enumerate(zip(out.seq_ids.tolist(), out.num_scheduled_tokens.tolist(),
                                            out.num_computed_tokens.tolist())):
            seq = st.seqs.get(sid)
            if seq is None:
                continue
            if c + n > seq["num_tokens"]:           # a chunk never passes the known tokens: drafts came
                seq["num_tokens"] = c + n
            if rows is not None and rows[i] > 1:
                kind = VERIFY
                drafted[sid] = rows[i] - 1
            else:
                kind = (DECODE if n == 1 and c + 1 == seq["num_tokens"] else
                        RECOMPUTE if seq["num_tokens"] > seq["num_prompt_tokens"] else PREFILL)
            scheduled.append([sid, n, c, kind, 0])
            seq["num_computed_tokens"] = c + n
            # A table changes only where this step allocated for the sequence (new blocks, CoW, prefix
            # hits, swap-in): read just those rows, the step's cost stays O(changes).
            if lengths[i] != len(seq["block_table"]) or sid in acc.allocating:
                table = bt[i, :lengths[i]].tolist()
                if table != seq["block_table"]:
                    tables[str(sid)] = table_delta(seq["block_table"], table)
                    seq["block_table"] = table
        spec = self._read_accepted(out, drafted, tables) if num_drafts else None
        for sid in out.sample_seq_ids.tolist():   # update() appends one token to every sampled row
            seq = st.seqs.get(sid)
            if seq is not None:
                known = spec["num_tokens"].get(sid) if spec else None    # drafts: what the pool kept
                seq["num_tokens"] = known if known is not None else seq["num_tokens"] + 1
                if seq["first_token_time"] is None:
                    seq["first_token_time"] = now
        self._read_events(result.events.tolist(), acc, now)
        for row in scheduled:                     # [seq_id, tokens, computed before, kind, num_tokens after]
            seq = st.seqs.get(row[0])
            row[4] = seq["num_tokens"] if seq is not None else -1
            if seq is not None and row[3] == VERIFY and seq["num_computed_tokens"] != row[1] + row[2]:
                row.append(seq["num_computed_tokens"])   # rejected drafts: the KV rolled back

        st.step, st.time = out.step_id, now
        record = {"kind": "step", "step": out.step_id, "time": now,
                  "num_tokens": out.num_tokens, "num_prefill_tokens": out.num_prefill_tokens,
                  "num_decode_tokens": out.num_decode_tokens, "num_seqs": out.num_seqs,
                  "num_context_tokens": int(out.seq_lens.sum()) if out.num_seqs else 0,
                  "scheduled": scheduled, "tables": tables}
        if spec is not None:
            del spec["num_tokens"]
            record["spec"] = spec
        if timing is not None:
            record["timing"] = {k: round(timing[k], 7) for k in ("schedule", "forward", "sample", "total")
                                if k in timing}
        return self._finish_record(record, acc)

    def _read_accepted(self, out, drafted: dict, tables: dict) -> dict:
        """Drafted and accepted tokens of a step that verified drafts (vLLM's spec-decode counters):
        a row with k drafts keeps m tokens, 0..k + 1, of which min(m, k + 1) - 1 are accepted drafts
        and one is the target model's own. Read from the pool after update(): m is not in its result.
        Rejected drafts also give back the blocks that held only them: the table shrinks here."""
        st = self.state
        per_seq, num_tokens, accepted, generated = [], {}, 0, 0
        for sid in out.sample_seq_ids.tolist():
            seq, info = st.seqs.get(sid), self.scheduler.get_sequence(sid)
            k = drafted.get(sid, 0)
            if seq is None or info is None:   # finished with this step: its FINISH event counts its tokens
                generated += 1
                continue
            after = info.num_tokens - getattr(info, "num_draft_tokens", 0)
            m = after - (seq["num_tokens"] - k)
            num_tokens[sid] = after
            seq["num_computed_tokens"] = info.num_computed_tokens
            generated += m
            table = list(info.block_table)
            if table != seq["block_table"]:   # whole: a delta from the grown table would not apply to the old one
                tables[str(sid)] = [0] + table
                seq["block_table"] = table
            if k:
                accepted += max(0, m - 1)
                per_seq.append([sid, k, max(0, m - 1)])
        return {"num_draft_tokens": out.num_draft_tokens, "num_accepted_tokens": accepted,
                "num_generated_tokens": generated, "seqs": per_seq, "num_tokens": num_tokens}

    # -- between steps: aborts leave their events inside the C++ trace until the next schedule() ------------
    def sync(self, now: float | None = None) -> dict | None:
        """Reads the pool for sequences that ended outside a step (aborts); None when nothing changed."""
        now = self.clock() if now is None else now
        st, acc, pool = self.state, _Step(), self.scheduler.gpu_pool
        live = set(self.scheduler.waiting_ids()) | set(self.scheduler.running_ids()) | set(self.scheduler.swapped_ids())
        for sid in [s for s in st.seqs if s not in live]:
            seq = st.seqs[sid]
            targets = acc.cpu_blocks if seq["status"] == "swapped" else acc.blocks
            targets.update(seq["block_table"])
            self._end_seq(sid, FINISH_REASONS.index("abort"), seq["num_tokens"] - seq["num_prompt_tokens"], acc, now)
        for sid in live - st.seqs.keys():
            self._new_seq(sid, now, acc)
        for b in acc.blocks:
            st.ref[b] = pool.ref_count(b)
        for b in acc.cpu_blocks:
            st.cpu_owner[b] = NO_OWNER
        if st.ref.count(0) != pool.num_free_blocks:   # a failed step dropped its events: read every block
            for b in range(len(st.ref)):
                ref = pool.ref_count(b)
                if ref != st.ref[b]:
                    st.ref[b] = ref
                    acc.blocks.add(b)
        if not (acc.blocks or acc.seqs):
            return None
        return self._finish_record({"kind": "sync", "step": st.step, "time": now}, acc)

    # -- the event reader -----------------------------------------------------------------------------
    def _read_events(self, events: list, acc: _Step, now: float) -> None:
        st = self.state
        for etype, sid, a, b in events:
            if etype == SCHEDULE:
                continue                      # read from the SchedulerOutput arrays instead
            if etype == ALLOCATE:
                st.ref[a], st.owner[a] = 1, sid
                acc.blocks.add(a)
                acc.allocating.add(sid)
                acc.events["allocated"].append([a, sid])
            elif etype == FREE:
                st.ref[a] = b
                acc.blocks.add(a)
                acc.events["freed"].append([a, sid, b])
            elif etype == PREFIX_HIT:
                st.ref[a] = b
                acc.blocks.add(a)
                acc.allocating.add(sid)
                acc.events["prefix_hits"].append([a, sid, b])
                seq = st.seqs.get(sid)
                if seq is not None and seq["num_preemptions"] == 0 and seq["status"] == "waiting":
                    seq["num_cached_tokens"] += st.config["block_size"]
            elif etype == CACHE_REGISTER:
                st.cached[a] = True
                acc.blocks.add(a)
                acc.events["registered"].append(a)
            elif etype == EVICT:
                st.cached[a] = False
                acc.blocks.add(a)
                acc.events["evicted"].append(a)
            elif etype == COPY_ON_WRITE:
                acc.events["cow"].append([a, b, sid])
            elif etype == SWAP_OUT:
                st.cpu_owner[b] = sid
                acc.cpu_blocks.add(b)
                acc.swap_tables.setdefault(sid, []).append(b)
                acc.events["swapped_out"].append([a, b, sid])
            elif etype == SWAP_IN:
                st.cpu_owner[a] = NO_OWNER
                acc.cpu_blocks.add(a)
                acc.events["swapped_in"].append([a, b, sid])
            elif etype == PREEMPT:
                self._preempt(sid, PREEMPTION_MODES[a], acc)
            elif etype == QUEUE_MOVE:
                if a < 0:
                    self._new_seq(sid, now, acc)
                elif sid in st.seqs and b != SEQ_STATUS.index("finished"):
                    st.seqs[sid]["status"] = SEQ_STATUS[b]
                    acc.seqs.add(sid)
            elif etype == FINISH:
                if sid in st.seqs:
                    self._end_seq(sid, a, b, acc, now)
            elif etype == FORK:
                self._fork(sid, a, acc)
            elif etype == REJECT:
                acc.events["rejected"].append([sid, a])

    def _new_seq(self, sid: int, now: float, acc: _Step) -> None:
        st = self.state
        if sid in st.seqs:
            return                            # already seen by a sync
        info = self.scheduler.get_sequence(sid)
        known = self.resolve(sid) if self.resolve else None
        request_id, arrival = known[:2] if known else (str(sid), now)
        st.seqs[sid] = new_seq(request_id, info.num_prompt_tokens if info else 0, arrival)
        if known and len(known) > 2 and known[2]:
            # What other features know of the request (e.g. {"lora_name": ...}); the page shows what it finds.
            st.seqs[sid].update(known[2])
        acc.seqs.add(sid)

    def _preempt(self, sid: int, mode: str, acc: _Step) -> None:
        seq = self.state.seqs.get(sid)
        acc.preempted.append([sid, mode])
        if seq is None:
            return
        seq["num_preemptions"] += 1
        # Recompute drops the KV (computed back to 0); swap keeps it in CPU blocks.
        seq["block_table"] = acc.swap_tables.pop(sid, []) if mode == "swap" else []
        if mode == "recompute":
            seq["num_computed_tokens"] = 0
        acc.seqs.add(sid)

    def _fork(self, child: int, parent: int, acc: _Step) -> None:
        st = self.state
        src = st.seqs.get(parent)
        acc.events["forks"].append([child, parent])
        if src is None:
            return
        seq = dict(src, status="running", num_preemptions=0, block_table=list(src["block_table"]))
        st.seqs[child] = seq
        for b in seq["block_table"]:          # fork retains every parent block (no event of its own)
            st.ref[b] += 1
            acc.blocks.add(b)
        acc.seqs.add(child)

    def _end_seq(self, sid: int, reason: int, num_output: int, acc: _Step, now: float) -> None:
        seq = self.state.seqs.pop(sid)
        if seq["status"] == "swapped":        # free_swapped() releases CPU blocks without events
            for b in seq["block_table"]:
                self.state.cpu_owner[b] = NO_OWNER
                acc.cpu_blocks.add(b)
        first = seq["first_token_time"]
        acc.finished.append({
            "seq_id": sid, "request_id": seq["request_id"], "reason": FINISH_REASONS[reason],
            "num_prompt_tokens": seq["num_prompt_tokens"], "num_output_tokens": num_output,
            "num_cached_tokens": seq["num_cached_tokens"], "num_preemptions": seq["num_preemptions"],
            "ttft": None if first is None else first - seq["arrival"],
            "tpot": (now - first) / (num_output - 1) if first is not None and num_output > 1 else None,
            "e2e": now - seq["arrival"]})
        acc.seqs.add(sid)

    def _finish_record(self, record: dict, acc: _Step) -> dict:
        st = self.state
        for b in acc.blocks:                  # a free block that no hash reaches belongs to nobody
            if st.ref[b] == 0 and not st.cached[b]:
                st.owner[b] = NO_OWNER
        record["blocks"] = [[b, st.ref[b], st.owner[b], int(st.cached[b])] for b in sorted(acc.blocks)]
        record["cpu_blocks"] = [[b, st.cpu_owner[b]] for b in sorted(acc.cpu_blocks)]
        record["seqs"] = {str(s): (dict(st.seqs[s], block_table=list(st.seqs[s]["block_table"]))
                                   if s in st.seqs else None) for s in sorted(acc.seqs)}
        queues = {}
        for q in QUEUES:
            ids = getattr(self.scheduler, q + "_ids")()
            if ids != st.queues[q]:
                queues[q] = queue_delta(st.queues[q], ids)
                st.queues[q] = ids
        record["queues"] = queues
        s = self.scheduler.stats()
        st.stats = record["kv"] = {
            "usage": round(s.kv_cache_usage, 5), "num_free_blocks": s.num_free_blocks,
            "num_cached_free_blocks": s.num_cached_free_blocks, "num_free_cpu_blocks": s.num_free_cpu_blocks,
            "prefix_query_tokens": s.prefix_query_tokens, "prefix_hit_tokens": s.prefix_hit_tokens,
            "num_preemptions": s.num_preemptions, "num_evictions": s.num_evictions}
        record["events"] = {k: v for k, v in acc.events.items() if v}
        record["preempted"], record["finished"] = acc.preempted, acc.finished
        return record
