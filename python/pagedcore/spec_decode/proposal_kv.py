"""`ProposalKV`: the draft's K/V that a proposal already computed, reused by the next step's follow.

A draft model follows the target (draft_model.py): every step it runs the target's rows to keep its
own KV where the target's is. For a sequence verifying drafts, those rows are its last token y and
its drafts d_1 .. d_k at positions n .. n + k, and the proposal that made the drafts has just run the
draft over y, d_1 .. d_{k-1} at positions n .. n + k - 1, writing their K/V into scratch slots
(draft_proposer.py). The same function of the same tokens: instead of computing them again, the
follow copies those k slots into the real slots of the step and runs only the last row (d_k at
n + k), one row per verifying sequence instead of k + 1:

    step rows of s (k = 3)    y@n      d1@n+1   d2@n+2   d3@n+3
    proposal (last step)      y@n      d1@n+1   d2@n+2              K/V in scratch slots  s0 s1 s2
    follow (this step)        copy s0  copy s1  copy s2  forward    into the step's real slots

Exactness does not depend on it (the target verifies every draft; the draft's KV only decides what
it proposes), and values equal the follow's up to rounding (a one-row forward vs a (k + 1)-row one).
A record is used only in the step right after its proposal, when the step's rows of that sequence
are exactly those positions and tokens (otherwise, e.g. after a preemption, the rows run as usual),
and after the step's block moves (a copy-on-write or swap-in lands first, then the copied K/V).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from pagedcore.engine.step_input import StepInput


@dataclass
class ProposalRecord:
    position: int          # n: the position of the sequence's last token y
    inputs: np.ndarray     # int64 [k] the tokens the proposal's forwards read at n .. n + k - 1
    slots: np.ndarray      # int64 [k] the scratch slots their K/V went to


def reuse_proposal_kv(step: StepInput, seq_ids: np.ndarray, records: dict[int, ProposalRecord],
                      kv_cache: torch.Tensor) -> StepInput:
    """Copies each matching sequence's proposal K/V (kv_cache [L, 2, num_blocks, H, block_size, D])
    into the step's real slots and returns the step without those rows (block moves already done)."""
    qsl = step.query_start_loc                                                   # int32 [num_seqs + 1]
    keep = np.ones(step.num_tokens, dtype=bool)                                  # [num_tokens]
    lens = np.diff(qsl).astype(np.int64)                                         # [num_seqs]
    src, dst = [], []
    for i, sid in enumerate(seq_ids.tolist()):
        record = records.get(sid)
        if record is None:
            continue
        k = record.inputs.shape[0]
        start, end = int(qsl[i]), int(qsl[i + 1])
        if end - start != k + 1 or int(step.positions[start]) != record.position \
                or not np.array_equal(step.input_ids[start:start + k], record.inputs):
            continue
        src.append(record.slots)
        dst.append(step.slot_mapping[start:start + k])
        keep[start:start + k] = False
        lens[i] = 1
    if not src:
        return step
    block_size = kv_cache.shape[4]
    s = torch.from_numpy(np.concatenate(src).astype(np.int64))                  # [C] scratch slots
    d = torch.from_numpy(np.concatenate(dst).astype(np.int64))                  # [C] real slots
    # [L, 2, C, H, D] gathered at (block, offset) pairs, written to the real ones.
    kv_cache[:, :, d // block_size, :, d % block_size, :] = kv_cache[:, :, s // block_size, :, s % block_size, :]
    query_start_loc = np.zeros_like(qsl)                                         # int32 [num_seqs + 1]
    query_start_loc[1:] = np.cumsum(lens)
    input_ids = step.input_ids[keep]
    return dataclasses.replace(step, input_ids=input_ids, positions=step.positions[keep],
                               slot_mapping=step.slot_mapping[keep], query_start_loc=query_start_loc,
                               num_tokens=int(input_ids.shape[0]), max_query_len=int(lens.max()) if len(lens) else 0)
