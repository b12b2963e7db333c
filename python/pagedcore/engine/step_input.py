"""StepInput: the model input of one step, as a plain value a worker can receive.

Flat numpy arrays and a few integers, taken from the C++ SchedulerOutput by reference (the
in-process worker copies nothing); it pickles, so a worker in another process gets the same value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class StepInput:
    input_ids: np.ndarray           # int64 [num_tokens]
    positions: np.ndarray           # int64 [num_tokens]
    slot_mapping: np.ndarray        # int64 [num_tokens], -1 = padding
    block_tables: np.ndarray        # int32 [num_seqs, max_num_blocks_per_seq], -1 padded
    seq_lens: np.ndarray            # int32 [num_seqs], after this step
    query_start_loc: np.ndarray     # int32 [num_seqs + 1]
    logits_indices: np.ndarray      # int64 [num_logits_rows]: sampled rows, then any prompt-logprob rows
    blocks_to_swap_out: np.ndarray  # int32 [n, 2] (device block, cpu block)
    blocks_to_swap_in: np.ndarray   # int32 [n, 2] (cpu block, device block)
    blocks_to_copy: np.ndarray      # int32 [n, 2] (src, dst), copy-on-write
    num_tokens: int
    max_query_len: int
    max_seq_len: int
    adapter_ids: np.ndarray | None = None  # uint64 [num_seqs] LoRA adapter per sequence (0: base); None: no LoRA

    @classmethod
    def from_scheduler_output(cls, out, extra_logits_rows: np.ndarray | None = None) -> StepInput:
        """out: a _core.SchedulerOutput (its arrays are views that keep it alive). extra_logits_rows
        int64 [num_extra]: token rows whose logits are wanted after the sampled ones (prompt logprobs)."""
        logits_indices = out.logits_indices
        if extra_logits_rows is not None and len(extra_logits_rows):
            logits_indices = np.concatenate([logits_indices, extra_logits_rows])
        return cls(
            input_ids=out.input_ids, positions=out.positions, slot_mapping=out.slot_mapping,
            block_tables=out.block_tables, seq_lens=out.seq_lens, query_start_loc=out.query_start_loc,
            logits_indices=logits_indices, blocks_to_swap_out=out.blocks_to_swap_out,
            blocks_to_swap_in=out.blocks_to_swap_in, blocks_to_copy=out.blocks_to_copy,
            num_tokens=out.num_tokens, max_query_len=out.max_query_len, max_seq_len=out.max_seq_len,
            adapter_ids=out.adapter_ids)
