"""Micro-batches of a step (pipeline parallelism): split by whole sequences, merge == identity."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedcore.distributed.micro_batches import merge_logits, split_boundaries, split_step
from pagedcore.engine.step_input import StepInput

VOCAB = 5


def make_step(query_lens: list[int], rows: list[int], block_moves: bool = False) -> StepInput:
    """A step of len(query_lens) sequences with the given new-token counts; logits rows are token indices."""
    qsl = np.zeros(len(query_lens) + 1, dtype=np.int32)
    qsl[1:] = np.cumsum(query_lens)
    num_tokens = int(qsl[-1])
    seq_lens = np.asarray(query_lens, dtype=np.int32) + 7          # some tokens cached before the step
    moves = np.array([[1, 2]], dtype=np.int32) if block_moves else np.zeros((0, 2), dtype=np.int32)
    return StepInput(
        input_ids=np.arange(100, 100 + num_tokens, dtype=np.int64), positions=np.arange(num_tokens, dtype=np.int64),
        slot_mapping=np.arange(200, 200 + num_tokens, dtype=np.int64),
        block_tables=np.arange(len(query_lens) * 3, dtype=np.int32).reshape(len(query_lens), 3),
        seq_lens=seq_lens, query_start_loc=qsl, logits_indices=np.asarray(rows, dtype=np.int64),
        blocks_to_swap_out=moves, blocks_to_swap_in=moves, blocks_to_copy=moves, num_tokens=num_tokens,
        max_query_len=max(query_lens), max_seq_len=int(seq_lens.max()),
        adapter_ids=np.arange(len(query_lens), dtype=np.uint64))


def fake_logits(step: StepInput, first_token: int) -> np.ndarray:
    """What a model would return for a (sub-)step: each row says which token of the whole step it is."""
    tokens = step.logits_indices + first_token                     # int64 [rows]
    return np.stack([tokens * 10.0 + v for v in range(VOCAB)], axis=1).astype(np.float32)


@st.composite
def steps(draw):
    query_lens = draw(st.lists(st.integers(1, 9), min_size=1, max_size=12))
    num_tokens = sum(query_lens)
    qsl = np.concatenate([[0], np.cumsum(query_lens)])
    # Sampled rows: the last token of each sequence, or its last k + 1 (spec decode), then prompt-logprob rows.
    rows = []
    for s, n in enumerate(query_lens):
        k = draw(st.integers(0, n - 1))
        rows += list(range(qsl[s + 1] - 1 - k, qsl[s + 1]))
    rows += draw(st.lists(st.integers(0, num_tokens - 1), max_size=6))
    return make_step(query_lens, rows, block_moves=draw(st.booleans())), draw(st.integers(1, 4))


@settings(max_examples=300, deadline=None)
@given(steps())
def test_split_then_merge_is_identity(case):
    step, max_pieces = case
    pieces = split_step(step, max_pieces)
    assert 1 <= len(pieces) <= max_pieces
    # Whole sequences, in order, covering every token once.
    assert sum(p.step.num_tokens for p in pieces) == step.num_tokens
    assert sum(len(p.step.seq_lens) for p in pieces) == len(step.seq_lens)
    for name in ("input_ids", "positions", "slot_mapping"):
        np.testing.assert_array_equal(np.concatenate([getattr(p.step, name) for p in pieces]), getattr(step, name))
    for name in ("seq_lens", "block_tables", "adapter_ids"):
        np.testing.assert_array_equal(np.concatenate([getattr(p.step, name) for p in pieces]), getattr(step, name))
    for p in pieces:
        sub = p.step
        assert sub.num_tokens > 0 and sub.query_start_loc[0] == 0 and sub.query_start_loc[-1] == sub.num_tokens
        np.testing.assert_array_equal(sub.query_start_loc + p.first_token,
                                      step.query_start_loc[np.searchsorted(step.query_start_loc, p.first_token):][
                                          :len(sub.query_start_loc)])
        assert sub.max_query_len == int(np.diff(sub.query_start_loc).max())
        assert sub.max_seq_len == int(sub.seq_lens.max())
        if len(pieces) > 1:
            assert len(sub.blocks_to_copy) == len(sub.blocks_to_swap_in) == len(sub.blocks_to_swap_out) == 0
    merged = merge_logits(pieces, [fake_logits(p.step, p.first_token) for p in pieces], len(step.logits_indices))
    np.testing.assert_array_equal(merged, fake_logits(step, 0))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=20), st.integers(1, 4))
def test_pieces_are_near_equal(query_lens, max_pieces):
    """No piece can be improved by moving one boundary sequence: each cut is the nearer side of its target."""
    qsl = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    bounds = split_boundaries(qsl, max_pieces)
    assert bounds[0] == 0 and bounds[-1] == len(query_lens)
    assert all(a < b for a, b in zip(bounds, bounds[1:]))
    assert len(bounds) - 1 == min(max_pieces, len(query_lens))
    total = int(qsl[-1])
    pieces = len(bounds) - 1
    for k, cut in enumerate(bounds[1:-1], start=1):
        target = total * k / pieces
        # the cut is a boundary within one sequence's length of its target (or forced by the one-sequence-per-piece rule)
        forced = cut == bounds[k - 1] + 1 or cut == len(query_lens) - (pieces - k)
        assert forced or abs(int(qsl[cut]) - target) <= max(query_lens)


def test_example_from_the_module_docstring():
    step = make_step([3, 1, 4, 1], [2, 3, 7, 8, 0])
    pieces = split_step(step, 2)
    assert [p.first_token for p in pieces] == [0, 4]
    assert pieces[0].step.logits_indices.tolist() == [2, 3, 0] and pieces[0].row_positions.tolist() == [0, 1, 4]
    assert pieces[1].step.logits_indices.tolist() == [3, 4] and pieces[1].row_positions.tolist() == [2, 3]


def test_a_step_that_cannot_be_cut_is_one_piece():
    one_seq = make_step([5], [4])
    assert len(split_step(one_seq, 4)) == 1 and split_step(one_seq, 4)[0].step is one_seq
    padded = make_step([2, 2], [1, 3])
    padded.num_tokens = 6   # rows past the last sequence (padding): not cut
    assert len(split_step(padded, 2)) == 1
    many = make_step([2, 2, 2], [1, 3, 5])
    assert len(split_step(many, 1)) == 1
