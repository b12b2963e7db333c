"""Micro-batches of one step for pipeline parallelism: split a StepInput by whole sequences, and put
the logits rows of the pieces back in the step's `logits_indices` order.

Stage p runs micro-batch k while stage p + 1 runs k - 1, so a step of M micro-batches over P stages
keeps every stage busy for M of its M + P - 1 slots. Sequences are never cut: a sequence's tokens
attend to each other within the step, and its KV writes must land before its own later tokens read
them. Every rank computes the same split from the same StepInput (it is deterministic), so no plan
travels between ranks.

    tokens   |s0 s0 s0|s1|s2 s2 s2 s2|s3|        query_start_loc = [0, 3, 4, 8, 9]
    split    |--- mb 0 --|--- mb 1 ----|         by whole sequences, near-equal tokens
    rows     logits_indices = [2, 3, 7, 8, 0]    (sampled rows, then e.g. prompt-logprob rows)
             mb 0 keeps rows 2, 3, 0 (as 2, 3, 0) at positions 0, 1, 4 of the step's logits
             mb 1 keeps rows 7, 8 (as 3, 4 after rebasing by its first token 4) at positions 2, 3

Pure numpy: no torch, so the split and merge are tested on their own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pagedcore.engine.step_input import StepInput

_NO_BLOCK_MOVES = np.zeros((0, 2), dtype=np.int32)   # int32 [0, 2]: moves run once per step, not per piece


@dataclass(slots=True)
class MicroBatch:
    step: StepInput            # the sub-step: its own tokens, sequences, and rebased logits rows; no block moves
    first_token: int           # the sub-step's token 0 is the step's token first_token
    row_positions: np.ndarray  # int64 [num_rows_of_piece]: where each of its logits rows sits in the step's


def split_boundaries(query_start_loc: np.ndarray, max_pieces: int) -> list[int]:
    """Sequence indices [0, b1, ..., num_seqs] that cut the step into at most max_pieces runs of whole
    sequences with near-equal token counts (none empty). query_start_loc int32 [num_seqs + 1]."""
    num_seqs = len(query_start_loc) - 1
    pieces = max(1, min(max_pieces, num_seqs))
    if pieces == 1:
        return [0, num_seqs]
    total = int(query_start_loc[-1])
    bounds = [0]
    for k in range(1, pieces):
        # The first sequence boundary at or past k/pieces of the tokens, kept strictly increasing and
        # leaving at least one sequence for each piece still to come.
        target = total * k / pieces
        cut = int(np.searchsorted(query_start_loc, target, side="left"))
        # Prefer the nearer of the boundaries around the target.
        if cut > 0 and abs(query_start_loc[cut - 1] - target) <= abs(query_start_loc[min(cut, num_seqs)] - target):
            cut -= 1
        cut = max(cut, bounds[-1] + 1)
        cut = min(cut, num_seqs - (pieces - k))
        bounds.append(cut)
    bounds.append(num_seqs)
    return bounds


def split_step(step: StepInput, max_pieces: int) -> list[MicroBatch]:
    """The step as at most max_pieces micro-batches (one when it cannot be cut: a single sequence, no
    tokens, or padded rows past the last sequence's tokens)."""
    qsl = step.query_start_loc                                   # int32 [num_seqs + 1]
    num_seqs = len(step.seq_lens)
    if step.num_tokens == 0 or num_seqs <= 1 or max_pieces <= 1 or int(qsl[-1]) != step.num_tokens:
        rows = np.arange(len(step.logits_indices), dtype=np.int64)
        return [MicroBatch(step, 0, rows)]
    bounds = split_boundaries(qsl, max_pieces)
    rows_all = np.asarray(step.logits_indices, dtype=np.int64)  # int64 [num_logits_rows]
    pieces = []
    for s0, s1 in zip(bounds[:-1], bounds[1:]):
        t0, t1 = int(qsl[s0]), int(qsl[s1])
        in_piece = (rows_all >= t0) & (rows_all < t1)
        row_positions = np.flatnonzero(in_piece).astype(np.int64)
        q_lens = np.diff(qsl[s0:s1 + 1])
        sub = StepInput(
            input_ids=step.input_ids[t0:t1], positions=step.positions[t0:t1],
            slot_mapping=step.slot_mapping[t0:t1], block_tables=step.block_tables[s0:s1],
            seq_lens=step.seq_lens[s0:s1], query_start_loc=(qsl[s0:s1 + 1] - qsl[s0]).astype(qsl.dtype),
            logits_indices=rows_all[row_positions] - t0,
            blocks_to_swap_out=_NO_BLOCK_MOVES, blocks_to_swap_in=_NO_BLOCK_MOVES, blocks_to_copy=_NO_BLOCK_MOVES,
            num_tokens=t1 - t0, max_query_len=int(q_lens.max()), max_seq_len=int(step.seq_lens[s0:s1].max()),
            adapter_ids=None if step.adapter_ids is None else step.adapter_ids[s0:s1])
        pieces.append(MicroBatch(sub, t0, row_positions))
    return pieces


def merge_logits(pieces: list[MicroBatch], piece_logits: list[np.ndarray], num_rows: int) -> np.ndarray:
    """piece_logits[k]: fp32 [len(pieces[k].row_positions), vocab] -> fp32 [num_rows, vocab], each row
    back at its place in the step's logits_indices."""
    if len(pieces) == 1:
        return piece_logits[0]
    vocab = next((a.shape[1] for a in piece_logits if a.ndim == 2 and a.shape[0]), 0)
    out = np.empty((num_rows, vocab), dtype=np.float32)          # fp32 [num_rows, vocab]
    filled = 0
    for piece, logits in zip(pieces, piece_logits):
        if len(piece.row_positions):
            out[piece.row_positions] = logits
            filled += len(piece.row_positions)
    if filled != num_rows:
        raise ValueError(f"micro-batches returned {filled} logits rows, the step wants {num_rows}")
    return out
