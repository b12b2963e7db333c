"""A shadow of the KV cache for scheduler tests: which token each slot holds.

Applying a step's swaps, copies and writes to the shadow, then reading every scheduled
sequence's context back through its block table, checks that the scheduler's bookkeeping
(prefix hits, copy-on-write, swap round trips, recompute) hands each sequence exactly its own KV.
"""

import numpy as np

EMPTY = -1


class ShadowCache:
    def __init__(self, num_gpu_blocks: int, num_cpu_blocks: int, block_size: int):
        self.block_size = block_size
        self.gpu = np.full((num_gpu_blocks, block_size), EMPTY, dtype=np.int64)  # [blocks, block_size]
        self.cpu = np.full((max(num_cpu_blocks, 1), block_size), EMPTY, dtype=np.int64)

    def apply(self, out) -> None:
        """Replays one SchedulerOutput in the runner's order: swap out, swap in, copy, write."""
        for gpu_block, cpu_block in out.blocks_to_swap_out:
            self.cpu[cpu_block] = self.gpu[gpu_block]
        for cpu_block, gpu_block in out.blocks_to_swap_in:
            self.gpu[gpu_block] = self.cpu[cpu_block]
        for src, dst in out.blocks_to_copy:
            self.gpu[dst] = self.gpu[src]
        flat = self.gpu.reshape(-1)
        valid = out.slot_mapping >= 0
        flat[out.slot_mapping[valid]] = out.input_ids[valid]

    def context(self, block_table, length: int) -> np.ndarray:
        """Tokens a kernel would read for positions [0, length) through this block table."""
        pos = np.arange(length)
        table = np.asarray(block_table)
        return self.gpu[table[pos // self.block_size], pos % self.block_size]
