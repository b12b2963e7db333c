"""Exact bookkeeping of the C++ scheduler and block pool through the Python binding."""

import numpy as np
import pytest

from pagedcore import _core

from .scheduler_model import ShadowCache


def make(num_blocks=16, block_size=4, budget=64, **kw):
    cfg = _core.SchedulerConfig(num_gpu_blocks=num_blocks, block_size=block_size,
                                max_num_batched_tokens=budget, max_num_seqs=kw.pop("max_num_seqs", 8),
                                max_model_len=kw.pop("max_model_len", 256), **kw)
    return _core.Scheduler(cfg)


def step(s, token=7):
    out = s.schedule()
    res = s.update(np.full(len(out.sample_seq_ids), token))
    return out, res


def test_block_ids_ref_counts_and_free_list_order():
    pool = _core.BlockPool(4, 16)
    ids = [pool.allocate() for _ in range(4)]
    assert ids == [0, 1, 2, 3]
    pool.retain(1)
    pool.release(2)
    pool.release(0)
    pool.release(1)
    assert pool.ref_count(1) == 1
    assert pool.free_block_ids() == [2, 0]          # LRU order: first freed, first reused
    assert pool.allocate() == 2
    with pytest.raises(RuntimeError, match="double free"):
        pool.release(2)
        pool.release(2)


def test_tokens_scheduled_per_request_under_budget():
    s = make(budget=10)
    s.add_sequence(1, np.arange(100, 125), max_tokens=4)   # 25-token prompt
    s.add_sequence(2, np.arange(200, 203), max_tokens=4)
    out, _ = step(s)
    assert out.seq_ids.tolist() == [1]                     # FCFS: request 1 takes the whole budget
    assert out.num_scheduled_tokens.tolist() == [10]
    out, _ = step(s)
    assert out.num_scheduled_tokens.tolist() == [10]
    out, _ = step(s)
    assert out.seq_ids.tolist() == [1, 2]
    assert out.num_scheduled_tokens.tolist() == [5, 3]
    assert out.sample_seq_ids.tolist() == [1, 2]
    assert out.logits_indices.tolist() == [4, 7]
    out, _ = step(s)
    assert out.num_scheduled_tokens.tolist() == [1, 1]
    assert out.num_decode_tokens == 2 and out.num_prefill_tokens == 0


def test_prefix_hits_across_requests_share_blocks():
    s = make()
    system = list(range(100, 112))                         # three full blocks of 4
    s.add_sequence(1, system + [1, 2], max_tokens=8)
    step(s)
    table1 = s.get_sequence(1).block_table
    s.add_sequence(2, system + [3, 4, 5], max_tokens=8)
    out, _ = step(s)
    seq2 = s.get_sequence(2)
    assert seq2.num_cached_tokens == 12
    assert seq2.block_table[:3] == table1[:3]
    for b in table1[:3]:
        assert s.gpu_pool.ref_count(b) == 2
    assert out.num_computed_tokens.tolist() == [14, 12]
    stats = s.stats()
    assert stats.prefix_hit_tokens == 12 and stats.prefix_query_tokens == 14 + 15


def test_preemption_order_is_latest_arrival_first():
    s = make(num_blocks=6)
    for i in range(3):
        s.add_sequence(i, np.arange(7) + 100 * i, max_tokens=50)   # 2 blocks each
    step(s)
    step(s)
    out = s.schedule()                                     # each needs a 3rd block; none free
    assert out.preempted_seq_ids.tolist() == [2]
    assert out.seq_ids.tolist() == [0, 1]
    s.update(np.full(2, 7))
    assert s.waiting_ids() == [2]
    assert s.get_sequence(2).num_computed_tokens == 0


def test_swap_round_trip_keeps_kv():
    s = make(num_blocks=4, num_cpu_blocks=8, preemption_mode=_core.PreemptionMode.SWAP)
    shadow = ShadowCache(4, 8, 4)
    s.add_sequence(1, np.arange(7) + 10, max_tokens=6)
    s.add_sequence(2, np.arange(7) + 50, max_tokens=20)
    swapped_out = swapped_in = False
    for _ in range(30):
        if not s.has_unfinished():
            break
        out = s.schedule()
        shadow.apply(out)
        swapped_out |= len(out.blocks_to_swap_out) > 0
        swapped_in |= len(out.blocks_to_swap_in) > 0
        for sid, seq_len in zip(out.seq_ids, out.seq_lens):
            seq = s.get_sequence(int(sid))
            assert shadow.context(seq.block_table, int(seq_len)).tolist() == seq.token_ids[:seq_len]
        s.update(np.full(len(out.sample_seq_ids), 3))
    assert swapped_out and swapped_in
    assert not s.has_unfinished()
    assert s.gpu_pool.num_free_blocks == 4 and s.cpu_pool.num_free_blocks == 8


def test_copy_on_write_after_fork():
    s = make()
    s.add_sequence(1, np.arange(6) + 10, max_tokens=5)
    step(s, token=50)
    s.fork_sequence(1, 2, 60)
    out = s.schedule()
    assert out.blocks_to_copy.tolist() == [[1, 2]]
    assert out.block_tables.tolist() == [[0, 2], [0, 1]]
    assert out.input_ids.tolist() == [50, 60]
    s.update([51, 61])
    assert s.get_sequence(1).token_ids[-2:] == [50, 51]
    assert s.get_sequence(2).token_ids[-2:] == [60, 61]


def test_trace_records_events_only_when_enabled():
    quiet = make()
    quiet.add_sequence(1, [1, 2, 3], max_tokens=1)
    out, res = step(quiet)
    assert out.events.shape == (0, 4) and res.events.shape == (0, 4)
    loud = make(enable_trace=True)
    loud.add_sequence(1, [1, 2, 3], max_tokens=1)
    out, res = step(loud)
    kinds = {_core.TraceEventType(int(t)) for t in out.events[:, 0]}
    assert {_core.TraceEventType.ALLOCATE, _core.TraceEventType.QUEUE_MOVE,
            _core.TraceEventType.SCHEDULE} <= kinds
    assert _core.TraceEventType.FINISH in {_core.TraceEventType(int(t)) for t in res.events[:, 0]}


@pytest.mark.parametrize("bad, match", [
    (dict(num_gpu_blocks=0), "num_gpu_blocks"),
    (dict(num_gpu_blocks=4, block_size=12), "power of two"),
    (dict(num_gpu_blocks=4, max_num_seqs=0), "max_num_seqs"),
    (dict(num_gpu_blocks=4, enable_chunked_prefill=False, max_num_batched_tokens=16, max_model_len=64),
     "max_num_batched_tokens"),
])
def test_invalid_config_names_the_fix(bad, match):
    with pytest.raises(ValueError, match=match):
        _core.SchedulerConfig(**bad)


def test_misuse_raises_instead_of_crashing():
    s = make(num_blocks=2, max_model_len=16)
    with pytest.raises(ValueError, match="max_model_len"):
        s.add_sequence(1, np.arange(17), max_tokens=1)
    with pytest.raises(ValueError, match="whole cache"):
        s.add_sequence(1, np.arange(9), max_tokens=1)
    with pytest.raises(ValueError, match="not a token id"):
        s.add_sequence(1, [1, -5], max_tokens=1)
    with pytest.raises(ValueError, match="max_tokens"):
        s.add_sequence(1, [1], max_tokens=0)
    with pytest.raises(ValueError, match="no unfinished sequence"):
        s.fork_sequence(5, 6)
    with pytest.raises(RuntimeError, match="call schedule"):
        s.update([])
    with pytest.raises(IndexError):
        s.gpu_pool.ref_count(99)


def test_fork_in_update_for_parallel_samples():
    s = make()
    s.add_sequence(1, np.arange(6) + 10, max_tokens=3, eos_token_ids=[2])
    out = s.schedule()
    # One prompt row sampled three times: parent takes 50, children 60 and 2 (EOS).
    res = s.update([50], forks=[[1, 2, 60], [1, 3, 2]])
    assert res.finished_seq_ids.tolist() == [3]
    assert s.get_sequence(2).token_ids[-1] == 60
    assert s.get_sequence(1).token_ids[-1] == 50
    assert s.running_ids() == [1, 2]
    assert [s.gpu_pool.ref_count(b) for b in s.get_sequence(1).block_table] == [2, 2]
    out = s.schedule()
    assert out.blocks_to_copy.tolist() == [[1, 2]]          # both write into shared block 1
    s.update([51, 61])
    with pytest.raises(ValueError, match="not sampled"):
        s.schedule()
        s.update([1, 1], forks=[[7, 8, 1]])


def test_fork_in_update_with_max_tokens_one_finishes_all():
    s = make()
    s.add_sequence(1, [5, 6, 7], max_tokens=1)
    s.schedule()
    res = s.update([9], forks=[[1, 2, 8]])
    assert sorted(res.finished_seq_ids.tolist()) == [1, 2]
    assert s.gpu_pool.num_free_blocks == 16


def test_cancel_step_reschedules_the_same_tokens():
    s = make()
    s.add_sequence(1, [5, 6, 7], max_tokens=2)
    first = s.schedule()
    assert s.step_in_flight
    s.cancel_step()
    assert not s.step_in_flight
    again = s.schedule()
    assert again.input_ids.tolist() == first.input_ids.tolist()
    assert again.slot_mapping.tolist() == first.slot_mapping.tolist()
    s.update([1])
