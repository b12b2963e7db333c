"""`DraftProposer`: K drafts per sequence from a model forward (draft_model and layer_skip), as K
single-token batched forwards of the draft, each writing its K/V into scratch blocks.

The draft reads the KV of every position the target has computed (positions < n, where n is the
position of the sequence's last sampled token, the one without KV yet) from the sequence's own
blocks, and writes the KV of the positions it proposes (n .. n + K - 1) into scratch blocks that the
scheduler never hands out: the real cache is never written by a proposal, so nothing it writes can
leak into a block another sequence (a fork, a prefix-cache hit) reads, and a proposal needs no slot
the scheduler has not allocated yet. The verification step's forward computes those positions
again, into the real slots, for the tokens actually kept.

    block table of sequence m for the proposal (block size 4, n = 9, K = 4):
      logical block    0     1     2            3
      physical         b0    b1    s_m0         s_m1          (s_m*: its scratch blocks)
      positions        0-3   4-7   8 | 9 10 11  12
                                   ^ copied from the real block b2 first (position 8 has KV)
    forward j (j = 0 .. K-1): one row per proposing sequence, input = its last token (j = 0) or its
    draft j - 1, position n + j, slot in s_m*, seq_len n + j + 1 -> logits -> draft j (argmax, or a
    draw from q = the sequence's sampling distribution over the draft's logits when temperature > 0)

Sequences are proposed for in chunks of at most `max_seqs` (the scratch holds that many), so any
number of sequences can propose in one step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from pagedcore.layers.attention import AttentionMetadata
from pagedcore.ops import attention as kernels
from pagedcore.spec_decode.proposal_kv import ProposalRecord
from pagedcore.spec_decode.rejection_sampler import target_probs

# The most sequences one chunk of proposals covers (the scratch blocks are sized for this many).
MAX_SEQS_PER_CHUNK = 32


def scratch_blocks_per_seq(block_size: int, num_speculative_tokens: int) -> int:
    """Blocks covering positions n .. n + K - 1 from any offset n % block_size: ceil((B - 1 + K) / B)."""
    return -(-(block_size - 1 + num_speculative_tokens) // block_size)


@dataclass
class DraftRequest:
    """One sequence's proposal: K drafts after last_token, which sits at `position` without KV."""

    seq: object                 # the engine's SequenceState (params, generator)
    last_token: int             # the sampled token at `position`
    position: int               # n: every position < n holds the target's (and the draft's) KV
    num_drafts: int             # k <= K drafts wanted
    block_table: np.ndarray     # int32 [>= ceil(n / block_size)] the sequence's physical blocks


# (input_ids int64 [A], positions int64 [A], metadata) -> fp32 logits [A, vocab]
DraftForward = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata], torch.Tensor]


class DraftProposer:
    def __init__(self, forward: DraftForward, kv_cache: torch.Tensor, scratch_block_ids: np.ndarray,
                 num_speculative_tokens: int):
        """kv_cache [draft_layers, 2, num_blocks, num_kv_heads, block_size, head_dim], contiguous: the
        cache the draft's layers read and write (its own, or the target's first layers);
        scratch_block_ids int32 [S]: blocks of it the scheduler never allocates."""
        self.forward = forward
        self.kv_cache = kv_cache
        self.device = kv_cache.device
        self.block_size = kv_cache.shape[4]
        self.k = num_speculative_tokens
        self.blocks_per_seq = scratch_blocks_per_seq(self.block_size, num_speculative_tokens)
        self.max_seqs = scratch_block_ids.shape[0] // self.blocks_per_seq
        if self.max_seqs < 1:
            raise ValueError(f"the draft needs {self.blocks_per_seq} scratch blocks, got {scratch_block_ids.shape[0]}")
        self.scratch = scratch_block_ids[:self.max_seqs * self.blocks_per_seq].reshape(
            self.max_seqs, self.blocks_per_seq).astype(np.int32)           # [max_seqs, blocks_per_seq]
        # seq_id -> where the last proposal put its K/V (proposal_kv.py; a draft model's follow reuses
        # it). Only the last chunk's: a later chunk reuses the scratch of an earlier one.
        self.records: dict[int, ProposalRecord] = {}

    def propose(self, requests: list[DraftRequest]) -> list[tuple[np.ndarray, torch.Tensor | None]]:
        """Per request: (drafts int64 [k], q fp32 [k, vocab] for temperature > 0, else None)."""
        out = []
        self.records = {}
        for start in range(0, len(requests), self.max_seqs):
            out += self._propose_chunk(requests[start:start + self.max_seqs])
        return out

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(array)
        return t if self.device.type == "cpu" else t.to(self.device, non_blocking=True)

    def _propose_chunk(self, reqs: list[DraftRequest]) -> list[tuple[np.ndarray, torch.Tensor | None]]:
        B = self.block_size
        num = len(reqs)
        n = np.array([r.position for r in reqs], dtype=np.int64)                 # [M]
        k = np.array([r.num_drafts for r in reqs], dtype=np.int64)               # [M]
        first = n // B                                                             # [M] logical block of n
        scratch = self.scratch[:num]                                               # [M, blocks_per_seq]
        tables = np.full((num, int(first.max()) + self.blocks_per_seq), -1, dtype=np.int32)  # [M, W]
        copies = []
        for m, r in enumerate(reqs):
            f = int(first[m])
            tables[m, :f] = r.block_table[:f]
            tables[m, f:f + self.blocks_per_seq] = scratch[m]
            if n[m] % B:  # the tail block holds positions < n with KV: the scratch starts as its copy
                copies.append((int(r.block_table[f]), int(scratch[m, 0])))
        if copies:
            kernels.copy_blocks(self.kv_cache, torch.tensor(copies, dtype=torch.int32))

        tokens = np.array([r.last_token for r in reqs], dtype=np.int64)          # [M] next inputs
        drafts = np.zeros((num, self.k), dtype=np.int64)                          # [M, K]
        read = np.zeros((num, self.k), dtype=np.int64)                            # [M, K] tokens read at n + j
        wrote = np.zeros((num, self.k), dtype=np.int64)                           # [M, K] their scratch slots
        random = [r.seq.params.temperature != 0 for r in reqs]
        q_rows: list[list[torch.Tensor]] = [[] for _ in reqs]                      # per m: [V] per draft
        active = np.arange(num)
        for j in range(self.k):
            active = active[k[active] > j]                                        # [A]
            if active.size == 0:
                break
            pos = n[active] + j                                                    # [A]
            blocks = scratch[active, pos // B - first[active]]                     # [A]
            slots = blocks.astype(np.int64) * B + pos % B                          # [A]
            seq_lens = (pos + 1).astype(np.int32)                                  # [A]
            md = AttentionMetadata(
                slot_mapping=self._tensor(slots), block_tables=self._tensor(np.ascontiguousarray(tables[active])),
                seq_lens=self._tensor(seq_lens),
                query_start_loc=self._tensor(np.arange(active.size + 1, dtype=np.int32)),
                max_query_len=1, max_seq_len=int(seq_lens.max()))
            logits = self.forward(self._tensor(tokens[active]), self._tensor(pos), md)   # fp32 [A, V]
            read[active, j] = tokens[active]
            wrote[active, j] = slots
            chosen = self._choose(logits, [reqs[m] for m in active], [random[m] for m in active],
                                  [q_rows[m] for m in active])                    # [A]
            drafts[active, j] = chosen
            tokens[active] = chosen
        self.records = {r.seq.seq_id: ProposalRecord(int(n[m]), read[m, :k[m]].copy(), wrote[m, :k[m]].copy())
                        for m, r in enumerate(reqs) if k[m] > 0}
        return [(drafts[m, :k[m]].copy(), torch.stack(q_rows[m]) if random[m] and q_rows[m] else None)
                for m in range(num)]

    @staticmethod
    def _choose(logits: torch.Tensor, reqs: list[DraftRequest], random: list[bool],
                q_rows: list[list[torch.Tensor]]) -> np.ndarray:
        """logits fp32 [A, V] -> the draft token of each row: argmax (greedy), or a draw from q, the
        request's own sampling distribution over these logits (appended to q_rows, for verification)."""
        chosen = logits.argmax(dim=-1).cpu().numpy().astype(np.int64)          # [A]
        rand = [a for a, r in enumerate(random) if r]
        if not rand:
            return chosen
        idx = torch.tensor(rand, device=logits.device)                            # [R]
        q = target_probs(logits.index_select(0, idx), [reqs[a].seq.params for a in rand])   # [R, V]
        unseeded = [i for i, a in enumerate(rand) if reqs[a].seq.generator is None]
        if unseeded:   # one draw for them all, from the global generator
            draws = torch.multinomial(q[unseeded], 1).flatten().cpu().numpy()     # [U]
            for i, t in zip(unseeded, draws):
                chosen[rand[i]] = t
        for i, a in enumerate(rand):
            gen = reqs[a].seq.generator
            if gen is not None:   # a seeded request draws from its own generator, whatever the batch
                chosen[a] = int(torch.multinomial(q[i], 1, generator=gen))
            q_rows[a].append(q[i])
        return chosen
