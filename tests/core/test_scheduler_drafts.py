"""The Python-visible step contract with draft tokens: logits rows, accepted tokens, rollback, cache keys."""

import numpy as np
import pytest

from pagedcore import _core

from .test_scheduler_bookkeeping import make, step


def prefilled(s, **kw):
    """Seq 1: prompt 100..105 prefilled and sampled 50 (7 tokens, 6 computed, blocks [0, 1])."""
    s.add_sequence(1, np.arange(100, 106), max_tokens=kw.pop("max_tokens", 20), **kw)
    step(s, 50)
    return s


def test_k_drafts_get_k_plus_one_logits_rows_in_sample_order():
    s = prefilled(make())
    s.add_sequence(2, np.arange(300, 303), max_tokens=20)
    s.append_tokens(1, [60, 61], draft=True)
    assert s.get_sequence(1).num_draft_tokens == 2
    out = s.schedule()
    assert out.seq_ids.tolist() == [1, 2]
    assert out.input_ids.tolist() == [50, 60, 61, 300, 301, 302]
    assert out.num_logits_rows.tolist() == [3, 1]
    assert out.sample_seq_ids.tolist() == [1, 2]
    assert out.logits_start_loc.tolist() == [0, 3, 4]
    assert out.logits_indices.tolist() == [0, 1, 2, 5]
    assert (out.num_samples, out.num_logits, out.num_draft_tokens) == (2, 4, 2)
    # The drafts a row verifies sit one token after it.
    assert out.input_ids[out.logits_indices[0:2] + 1].tolist() == [60, 61]
    res = s.update(np.array([60, 70, 7]), num_accepted_tokens=np.array([2, 1]))
    assert res.finished_seq_ids.tolist() == []
    seq = s.get_sequence(1)
    assert seq.token_ids[-3:] == [50, 60, 70]
    assert (seq.num_computed_tokens, seq.num_draft_tokens) == (8, 0)
    assert s.get_sequence(2).token_ids[-1] == 7


def test_rejection_frees_the_block_tail_and_reuses_the_slot():
    s = prefilled(make())
    s.append_tokens(1, np.arange(60, 69), draft=True)             # 16 tokens: blocks 0..3
    out = s.schedule()
    assert out.block_tables.tolist() == [[0, 1, 2, 3]]
    assert out.slot_mapping[2] == 8                               # draft 61 at position 8
    s.update([60, 70], num_accepted_tokens=[2])
    seq = s.get_sequence(1)
    assert seq.block_table == [0, 1, 2]
    assert s.gpu_pool.ref_count(3) == 0 and s.gpu_pool.is_free(3)
    assert s.gpu_pool.free_block_ids() == list(range(4, 16)) + [3]
    out = s.schedule()
    assert out.input_ids.tolist() == [70] and out.slot_mapping.tolist() == [8]
    s.update([71])


def test_stop_at_a_middle_accepted_token():
    s = prefilled(make(), eos_token_ids=[2])
    s.append_tokens(1, [60, 2, 62], draft=True)
    s.schedule()
    res = s.update([60, 2, 62, 63], num_accepted_tokens=[4])
    assert res.finished_seq_ids.tolist() == [1]
    assert res.finish_reasons.tolist() == [_core.FinishReason.STOP.value]
    assert res.stop_token_ids.tolist() == [2]
    assert s.get_sequence(1).token_ids[-3:] == [50, 60, 2]
    assert s.gpu_pool.num_free_blocks == 16


@pytest.mark.parametrize("tokens,counts,match", [
    ([60], [1, 1], "one count per SchedulerOutput.sample_seq_ids entry"),
    ([60, 61, 62, 63, 64], [5], "can accept 0..4 tokens"),
    ([60, 61], [1], "sums to 1 but 2 accepted tokens"),
    ([60], [-1], "not a count"),
    ([60], [[1]], "must be 1-D"),
    ([-3], [1], "not a token id"),
])
def test_bad_accepted_tokens_raise_value_error_and_keep_the_step(tokens, counts, match):
    s = prefilled(make())
    s.append_tokens(1, [60, 61, 62], draft=True)
    s.schedule()
    with pytest.raises(ValueError, match=match):
        s.update(np.array(tokens), num_accepted_tokens=np.array(counts))
    assert s.step_in_flight
    s.update([60, 61, 9], num_accepted_tokens=[3])
    assert s.get_sequence(1).token_ids[-4:] == [50, 60, 61, 9]


def test_one_token_form_is_unchanged_and_forks_need_no_drafts():
    s = prefilled(make())
    s.append_tokens(1, [60, 61], draft=True)
    s.schedule()
    with pytest.raises(ValueError, match="verified draft tokens"):
        s.update([60], np.array([[1, 9, 5]]))
    with pytest.raises(ValueError, match="one token per SchedulerOutput.sample_seq_ids entry"):
        s.update([60, 61, 62])
    s.update([60])                                                 # k = 0 form: the first row only
    assert s.get_sequence(1).token_ids[-2:] == [50, 60]


def test_append_and_remove_tail_tokens_misuse_names_the_fix():
    s = prefilled(make(budget=8))
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        s.append_tokens(1, np.arange(60, 68), draft=True)         # 9-token window > budget 8
    s.append_tokens(1, [60, 61], draft=True)
    with pytest.raises(ValueError, match="remove_tail_tokens"):
        s.append_tokens(1, [80])                                   # known tokens after drafts
    with pytest.raises(ValueError, match="can drop 0..2"):
        s.remove_tail_tokens(1, 3)
    s.remove_tail_tokens(1, 2)
    assert s.get_sequence(1).num_tokens == 7
    s.schedule()
    with pytest.raises(RuntimeError, match="after update"):
        s.remove_tail_tokens(1, 0)
    s.update([51])
    with pytest.raises(ValueError, match="no unfinished sequence"):
        s.remove_tail_tokens(99, 1)


def test_fork_mid_generation_copies_drafts():
    s = prefilled(make())
    s.append_tokens(1, [60, 61, 62], draft=True)
    with pytest.raises(ValueError, match="last_token_id=-1"):
        s.fork_sequence(1, 3, 77)
    assert s.get_sequence(3) is None
    s.fork_sequence(1, 2)
    assert s.get_sequence(2).num_draft_tokens == 3
    out = s.schedule()
    assert out.blocks_to_copy.tolist() == [[1, 2]]
    assert out.num_logits_rows.tolist() == [4, 4]
    s.update([60, 61, 62, 63, 70], num_accepted_tokens=[4, 1])
    assert s.get_sequence(1).block_table == [0, 2, 3]
    assert s.get_sequence(2).block_table == [0, 1]
    assert s.gpu_pool.ref_count(4) == 0


@pytest.mark.parametrize("first,second,hit", [
    ({}, {}, True),
    ({"cache_salt": 7}, {"cache_salt": 7}, True),
    ({"cache_salt": 7}, {"cache_salt": 8}, False),
    ({"adapter_id": 7}, {"cache_salt": 7}, False),                # one number in two slots: two keys
    ({"adapter_id": 3, "cache_salt": 5}, {"adapter_id": 3, "cache_salt": 5}, True),
    ({"adapter_id": 3, "cache_salt": 5}, {"adapter_id": 5, "cache_salt": 3}, False),
])
def test_cache_key_has_named_adapter_and_salt_parts(first, second, hit):
    s = make()
    s.add_sequence(1, np.arange(100, 110), max_tokens=1, **first)
    step(s)
    s.add_sequence(2, np.arange(100, 110), max_tokens=1, **second)
    out = s.schedule()
    assert out.num_computed_tokens.tolist() == ([8] if hit else [0])
    s.update([1])


def test_extra_key_is_gone():
    s = make()
    with pytest.raises(TypeError):
        s.add_sequence(1, [1, 2, 3], extra_key=5)


def test_set_draft_tokens_names_the_tokens_computed_in_placeholder_slots():
    """Multi-step: placeholders scheduled for their slots, the real tokens named before update(): every
    position keeps its KV (no rollback), and block hashes are those of the real tokens."""
    s = prefilled(make(block_size=4))
    s.append_tokens(1, [0, 0, 0], draft=True)                     # placeholders after 50
    out = s.schedule()
    assert out.input_ids.tolist() == [50, 0, 0, 0] and out.num_draft_tokens == 3
    with pytest.raises(ValueError, match="has 3 drafts, got 2 tokens"):
        s.set_draft_tokens(1, [60, 61])
    s.set_draft_tokens(1, [60, 61, 62])
    s.update([60, 61, 62, 63], num_accepted_tokens=[4])
    seq = s.get_sequence(1)
    assert seq.token_ids[-5:] == [50, 60, 61, 62, 63]
    assert (seq.num_computed_tokens, seq.num_draft_tokens) == (10, 0)   # only 63 waits for its KV
    # The full blocks were registered under the real tokens: a new prompt with them hits the cache.
    prompt = np.array([100, 101, 102, 103, 104, 105, 50, 60, 61, 62], dtype=np.int64)
    assert s.num_cached_prefix_tokens(prompt) == 8
