"""KVState: a mirror of the scheduler's block pools, block tables and queues, kept from trace events.

The same state is rebuilt three ways, and must agree: by StepTracer from the C++ events (the live
engine), by `apply()` from the step records of a JSONL trace (replay, the recorder's ring base), and
by the page's JavaScript (static/state.js). Step records hold *absolute* values (a block's ref count
after the step, a sequence's whole block table), never increments, so applying one twice is harmless:
a subscriber that receives a snapshot and then a step the snapshot already holds stays exact.
"""

from __future__ import annotations

import copy

# The engine's enums as ints (pagedcore._core.SeqStatus, FinishReason, PreemptionMode), so that
# reading a trace file needs no compiled extension.
SEQ_STATUS = ("waiting", "running", "swapped", "finished")
FINISH_REASONS = ("none", "stop", "length", "abort")
PREEMPTION_MODES = ("recompute", "swap")
QUEUES = ("waiting", "running", "swapped")

NO_OWNER = -1


def new_seq(request_id: str, num_prompt_tokens: int, arrival: float) -> dict:
    """One sequence as the page shows it (JSON-able; the engine's names)."""
    return {"request_id": request_id, "status": "waiting", "num_prompt_tokens": num_prompt_tokens,
            "num_tokens": num_prompt_tokens, "num_computed_tokens": 0, "num_cached_tokens": 0,
            "num_preemptions": 0, "block_table": [], "arrival": arrival, "first_token_time": None}


class KVState:
    """Block-level state of one engine: who holds each block, how many hold it, what is cached."""

    def __init__(self, config: dict):
        self.config = dict(config)  # num_gpu_blocks, num_cpu_blocks, block_size, max_num_seqs, ...
        n, n_cpu = config["num_gpu_blocks"], config.get("num_cpu_blocks", 0)
        self.ref = [0] * n                 # ref_count of each GPU block
        self.owner = [NO_OWNER] * n        # the seq that allocated it (a free, uncached block has none)
        self.cached = [False] * n          # reachable by its hash: a prefix-cache hit can reuse it
        self.cpu_owner = [NO_OWNER] * n_cpu  # swapped-out KV: the seq whose blocks these are
        self.seqs: dict[int, dict] = {}    # live sequences (not finished)
        self.queues = {q: [] for q in QUEUES}
        self.step = 0
        self.time = 0.0
        self.stats: dict = {}              # the last step's kv usage and counters

    # -- the snapshot a new subscriber or a trace file starts from ------------------------------------
    def snapshot(self) -> dict:
        return {"kind": "snapshot", "step": self.step, "time": self.time, "config": dict(self.config),
                "ref": list(self.ref), "owner": list(self.owner), "cached": [int(c) for c in self.cached],
                "cpu_owner": list(self.cpu_owner),
                "seqs": {str(k): copy.deepcopy(v) for k, v in self.seqs.items()},
                "queues": {q: list(ids) for q, ids in self.queues.items()}, "stats": dict(self.stats)}

    @classmethod
    def from_snapshot(cls, snap: dict) -> KVState:
        state = cls(snap["config"])
        state.ref, state.owner = list(snap["ref"]), list(snap["owner"])
        state.cached = [bool(c) for c in snap["cached"]]
        state.cpu_owner = list(snap["cpu_owner"])
        state.seqs = {int(k): copy.deepcopy(v) for k, v in snap["seqs"].items()}
        state.queues = {q: list(snap["queues"].get(q, [])) for q in QUEUES}
        state.step, state.time, state.stats = snap["step"], snap.get("time", 0.0), dict(snap.get("stats", {}))
        return state

    # -- replay: the state-changing part of a step record -----------------------------------------------
    def apply(self, record: dict) -> None:
        """Applies one "step" or "sync" record (see StepTracer for the fields)."""
        for b, ref, owner, cached in record.get("blocks", ()):
            self.ref[b], self.owner[b], self.cached[b] = ref, owner, bool(cached)
        for b, owner in record.get("cpu_blocks", ()):
            self.cpu_owner[b] = owner
        for key, seq in record.get("seqs", {}).items():
            if seq is None:
                self.seqs.pop(int(key), None)
            else:
                self.seqs[int(key)] = copy.deepcopy(seq)
        for row in record.get("scheduled", ()):   # [sid, n, computed, kind, num_tokens(, computed after)]
            seq = self.seqs.get(row[0])
            if seq is not None:   # a 6th value: rejected drafts rolled the computed tokens back
                seq["num_computed_tokens"] = row[5] if len(row) > 5 else row[2] + row[1]
                seq["num_tokens"] = row[4]
        for key, delta in record.get("tables", {}).items():     # [common prefix length, *new blocks]
            seq = self.seqs.get(int(key))
            if seq is not None:
                seq["block_table"] = seq["block_table"][:delta[0]] + list(delta[1:])
        for q, delta in record.get("queues", {}).items():
            if "ids" in delta:
                self.queues[q] = list(delta["ids"])
            else:
                removed = set(delta["remove"])
                kept = [x for x in self.queues[q] if x not in removed]
                self.queues[q] = list(delta["front"]) + kept + list(delta["add"])
        if "kv" in record:
            self.stats = dict(record["kv"])
        self.step = max(self.step, record.get("step", self.step))
        self.time = record.get("time", self.time)

    # -- comparing two states (tests, the page's replay-vs-live check) ------------------------------------
    def digest(self) -> dict:
        """What must agree between the live engine, a replayed trace and the page."""
        return {"ref": self.ref, "owner": [o if r or c else NO_OWNER for o, r, c in
                                           zip(self.owner, self.ref, self.cached)],
                "cached": [int(c) for c in self.cached], "cpu_owner": self.cpu_owner,
                "tables": {str(k): s["block_table"] for k, s in sorted(self.seqs.items())},
                "queues": self.queues}

    def block_state(self, b: int) -> str:
        """free | cached (free, still reachable by hash) | allocated | shared (ref > 1)."""
        if self.ref[b] == 0:
            return "cached" if self.cached[b] else "free"
        return "shared" if self.ref[b] > 1 else "allocated"
