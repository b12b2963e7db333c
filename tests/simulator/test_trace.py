"""The step trace as exact bookkeeping: after every step of random request streams (shared prefixes,
forks, aborts, preemption by recompute and by swap) the tracer's mirror equals the C++ pool, block
tables and queues; a JSONL trace replayed from its first line reaches the same state."""

import json

import numpy as np
import pytest

from pagedcore import _core
from pagedcore.simulator.kv_state import KVState
from pagedcore.simulator.recorder import TraceRecorder
from pagedcore.simulator.trace import StepTracer

SYSTEM = list(range(1000, 1040))   # a shared "system prompt" of 40 tokens


def make(num_blocks=24, num_cpu_blocks=16, block_size=4, budget=32, max_num_seqs=6, swap=False,
         prefix=True, trace=True):
    return _core.Scheduler(_core.SchedulerConfig(
        num_gpu_blocks=num_blocks, num_cpu_blocks=num_cpu_blocks, block_size=block_size,
        max_num_batched_tokens=budget, max_num_seqs=max_num_seqs, max_model_len=128,
        enable_prefix_caching=prefix, enable_trace=trace,
        preemption_mode=_core.PreemptionMode.SWAP if swap else _core.PreemptionMode.RECOMPUTE))


def assert_mirror_exact(s, state: KVState):
    pool = s.gpu_pool
    assert state.ref == [pool.ref_count(b) for b in range(pool.num_blocks)]
    assert sorted(b for b, r in enumerate(state.ref) if r == 0) == sorted(pool.free_block_ids())
    assert sum(state.cached) == pool.num_cached_blocks
    assert state.queues == {"waiting": s.waiting_ids(), "running": s.running_ids(), "swapped": s.swapped_ids()}
    live = set(s.waiting_ids()) | set(s.running_ids()) | set(s.swapped_ids())
    assert set(state.seqs) == live
    for sid in live:
        info, seq = s.get_sequence(sid), state.seqs[sid]
        assert seq["block_table"] == info.block_table, sid
        assert (seq["num_tokens"], seq["num_computed_tokens"], seq["status"]) == \
               (info.num_tokens, info.num_computed_tokens, info.status.name.lower()), sid
        if info.status == _core.SeqStatus.SWAPPED:
            assert all(state.cpu_owner[b] == sid for b in info.block_table)
    for b, owner in enumerate(state.owner):
        if state.ref[b] and owner >= 0 and owner in live and state.ref[b] == 1:
            assert b in s.get_sequence(owner).block_table or any(
                b in s.get_sequence(o).block_table for o in live)
    num_cpu_used = sum(o >= 0 for o in state.cpu_owner)
    assert num_cpu_used == s.cpu_pool.num_blocks - s.cpu_pool.num_free_blocks


def run_random_stream(s, rng, num_steps, recorder=None, check=True):
    tracer = recorder.tracer if recorder else StepTracer(s)
    next_id, records = 0, []
    for _ in range(num_steps):
        for _ in range(rng.poisson(0.7)):
            prompt = (SYSTEM[: rng.integers(8, 41)] if rng.random() < 0.6 else
                      list(rng.integers(10, 900, rng.integers(1, 40))))
            s.add_sequence(next_id, prompt, max_tokens=int(rng.integers(1, 30)), eos_token_ids=[2])
            next_id += 1
        if rng.random() < 0.05 and s.running_ids():       # abort between steps, then sync
            s.abort_sequence(int(rng.choice(s.running_ids())))
            rec = recorder.on_hook([], None) if recorder else tracer.sync()
            if rec is not None:
                records.append(rec)
            if check:
                assert_mirror_exact(s, tracer.state)
        if not s.has_unfinished():
            continue
        out = s.schedule()
        tokens = rng.integers(3, 900, len(out.sample_seq_ids))
        tokens[rng.random(len(tokens)) < 0.03] = 2         # EOS now and then
        forks = None
        sampled = out.sample_seq_ids.tolist()
        if sampled and rng.random() < 0.1:
            forks = np.array([[sampled[0], 10_000 + next_id, 55]], dtype=np.int64)
            next_id += 1
        res = s.update(tokens, forks)
        if recorder:
            recorder.on_step(out, res, {"total": 0.001})
        else:
            records.append(tracer.on_step(out, res, {"total": 0.001}))
        if check:
            assert_mirror_exact(s, tracer.state)
    return tracer, records


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("prefix", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_mirror_equals_pool_after_every_step(swap, prefix, seed):
    s = make(swap=swap, prefix=prefix)
    tracer, records = run_random_stream(s, np.random.default_rng(seed), 250)
    kinds = {k for r in records for k in r.get("events", {})}
    assert "allocated" in kinds and "freed" in kinds
    if prefix:
        assert "prefix_hits" in kinds and "registered" in kinds
    assert any(r.get("preempted") for r in records), "the stream should exhaust the cache"
    if swap:
        assert "swapped_out" in kinds and "swapped_in" in kinds


def test_replay_of_jsonl_reaches_the_live_state(tmp_path):
    path = tmp_path / "trace.jsonl"
    s = make(swap=True)
    recorder = TraceRecorder(trace_file=str(path), ring_size=50)
    recorder.start(StepTracer(s))
    tracer, _ = run_random_stream(s, np.random.default_rng(3), 300, recorder=recorder, check=False)
    recorder.close()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0]["kind"] == "snapshot" and all(x["kind"] in ("step", "sync") for x in lines[1:])
    replayed = KVState.from_snapshot(lines[0])
    for record in lines[1:]:
        replayed.apply(record)
    assert replayed.digest() == tracer.state.digest()
    # The ring (bounded at 50 records) is itself a replayable trace from its base snapshot.
    ring = [json.loads(x) for x in recorder.jsonl().splitlines()]
    assert len(ring) == 51
    again = KVState.from_snapshot(ring[0])
    for record in ring[1:]:
        again.apply(record)
    assert again.digest() == tracer.state.digest()


def test_finished_requests_carry_ttft_and_tpot():
    s = make(budget=8)
    clock = iter(float(t) for t in range(1, 1000))
    tracer = StepTracer(s, resolve=lambda sid: (f"req-{sid}", 0.0), clock=lambda: next(clock))
    s.add_sequence(0, list(range(100, 120)), max_tokens=4, ignore_eos=True)   # 20 tokens: 3 prefill steps
    finished = []
    while s.has_unfinished():
        out = s.schedule()
        finished += tracer.on_step(out, s.update(np.full(len(out.sample_seq_ids), 7)))["finished"]
    (f,) = finished
    assert f["request_id"] == "req-0" and f["reason"] == "length" and f["num_output_tokens"] == 4
    assert f["ttft"] == 3.0            # first token at the end of step 3 (clock 1, 2, 3 ...)
    assert f["tpot"] == 1.0 and f["e2e"] == 6.0


def test_tracer_refuses_an_untraced_scheduler():
    with pytest.raises(ValueError, match="enable_trace"):
        StepTracer(make(trace=False))


def test_a_subscriber_that_falls_behind_restarts_from_a_snapshot():
    import asyncio

    s = make(num_blocks=64)
    recorder = TraceRecorder(max_pending=3)
    recorder.start(StepTracer(s))
    for i in range(4):
        s.add_sequence(i, list(range(100 + i, 120 + i)), max_tokens=40, ignore_eos=True)

    def steps(n):
        for _ in range(n):
            out = s.schedule()
            recorder.on_step(out, s.update(np.full(len(out.sample_seq_ids), 7)), {"total": 0.001})

    loop = asyncio.new_event_loop()
    try:
        sub, first = recorder.subscribe(loop)
        assert first["kind"] == "snapshot" and first["history"] == []
        steps(2)
        lines = recorder.drain(sub)
        assert [json.loads(x)["step"] for x in lines] == [1, 2]
        steps(10)
        (again,) = recorder.drain(sub)            # more than max_pending came: one fresh snapshot instead
        snap = json.loads(again)
        assert snap["kind"] == "snapshot" and snap["step"] == 12 and len(snap["history"]) == 12
        assert KVState.from_snapshot(snap).digest() == recorder.tracer.state.digest()
        recorder.unsubscribe(sub)
        steps(1)
        assert recorder.drain(sub) == []
    finally:
        loop.close()


def test_drafted_and_accepted_tokens_are_recorded_and_the_mirror_stays_exact():
    # Speculative decoding: drafts arrive between steps without events; a step verifies them and
    # update() keeps m tokens per row (accepted drafts + the target's own), rolling the rest back.
    from pagedcore.simulator.trace import VERIFY

    s = make(num_blocks=32, block_size=4, budget=64)
    tracer = StepTracer(s)
    s.add_sequence(0, list(range(100, 106)), max_tokens=40, ignore_eos=True)
    s.add_sequence(1, list(range(200, 209)), max_tokens=40, ignore_eos=True)
    out = s.schedule()
    records = [tracer.on_step(out, s.update(np.full(len(out.sample_seq_ids), 7)))]
    assert "spec" not in records[0]
    s.append_tokens(0, [60, 61, 62, 63, 64, 65], draft=True)   # 7 + 6 tokens: a 4th block, for drafts only
    s.append_tokens(1, [70, 71], draft=True)
    out = s.schedule()
    assert out.num_draft_tokens == 8
    keep = {0: [60, 99], 1: [70, 71, 72]}       # seq 0: one draft, then the target's token; seq 1: all + bonus
    order = out.sample_seq_ids.tolist()
    res = s.update(np.array([t for sid in order for t in keep[sid]]),
                   num_accepted_tokens=np.array([len(keep[sid]) for sid in order]))
    rec = tracer.on_step(out, res)
    records.append(rec)
    assert rec["spec"]["num_draft_tokens"] == 8
    assert rec["spec"]["num_accepted_tokens"] == 1 + 2
    assert rec["spec"]["num_generated_tokens"] == 5
    assert sorted(rec["spec"]["seqs"]) == [[0, 6, 1], [1, 2, 2]]
    assert {row[3] for row in rec["scheduled"]} == {VERIFY}
    assert_mirror_exact(s, tracer.state)          # token counts and the shrunk block table of seq 0
    out = s.schedule()
    records.append(tracer.on_step(out, s.update(np.full(len(out.sample_seq_ids), 7))))
    assert_mirror_exact(s, tracer.state)
    replayed = KVState.from_snapshot(StepTracer(make(num_blocks=32, block_size=4, budget=64)).state.snapshot())
    for r in records:
        replayed.apply(r)
    assert replayed.digest() == tracer.state.digest()


def test_extras_from_the_resolver_ride_on_the_sequence():
    s = make()
    tracer = StepTracer(s, resolve=lambda sid: (f"req-{sid}", 0.0, {"lora_name": "sql-adapter"}))
    s.add_sequence(0, list(range(100, 110)), max_tokens=2, ignore_eos=True)
    out = s.schedule()
    rec = tracer.on_step(out, s.update(np.full(len(out.sample_seq_ids), 7)))
    assert rec["seqs"]["0"]["lora_name"] == "sql-adapter"
    assert tracer.state.snapshot()["seqs"]["0"]["lora_name"] == "sql-adapter"
