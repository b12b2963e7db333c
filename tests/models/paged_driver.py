"""A minimal stand-in for the model runner: paged KV cache, random block tables, AttentionMetadata
built by hand for prefill, chunked prefill, decode and mixed batches. Test-only."""

from __future__ import annotations

import torch

from pagedcore._core import PAD_SLOT
from pagedcore.layers.attention import AttentionMetadata

BLOCK_SIZE = 16


class PagedDriver:
    def __init__(self, model, num_blocks: int = 64, block_size: int = BLOCK_SIZE, seed: int = 0):
        config = model.config
        self.model = model
        self.block_size = block_size
        self.kv_cache = torch.zeros(  # [num_layers, 2, num_blocks, num_kv_heads, block_size, head_dim]
            config.num_layers, 2, num_blocks, config.num_kv_heads, block_size, config.head_dim,
            dtype=config.torch_dtype)
        # A shuffled free list, so every sequence's blocks are scattered and out of order.
        generator = torch.Generator().manual_seed(seed)
        self.free_blocks = torch.randperm(num_blocks, generator=generator).tolist()
        self.block_tables: dict[int, list[int]] = {}
        self.num_cached: dict[int, int] = {}

    def _slot(self, seq_id: int, position: int) -> int:
        table = self.block_tables[seq_id]
        while len(table) <= position // self.block_size:
            table.append(self.free_blocks.pop())
        return table[position // self.block_size] * self.block_size + position % self.block_size

    def step(self, chunks: list[tuple[int, list[int]]], num_padding: int = 0) -> torch.Tensor:
        """Runs one forward over new tokens of several sequences ([(seq_id, token_ids)], packed in this
        order), plus num_padding padding tokens at the end (slot -1, in no sequence). Returns the fp32
        logits of every real token, [num_real_tokens, vocab]."""
        input_ids, positions, metadata = self.prepare(chunks, num_padding)
        num_real = int(metadata.query_start_loc[-1])
        with torch.inference_mode():
            hidden = self.model(input_ids, positions, self.kv_cache, metadata)
            return self.model.compute_logits(hidden[:num_real])

    def prepare(self, chunks: list[tuple[int, list[int]]],
                num_padding: int = 0) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """The inputs of one step as `step` describes it: (input_ids, positions) int64 [num_tokens]
        and the metadata. Claims the cache slots (the sequences advance) without running the model."""
        input_ids, positions, slots, seq_lens, query_start_loc = [], [], [], [], [0]
        for seq_id, token_ids in chunks:
            self.block_tables.setdefault(seq_id, [])
            start = self.num_cached.get(seq_id, 0)
            for offset, token_id in enumerate(token_ids):
                input_ids.append(token_id)
                positions.append(start + offset)
                slots.append(self._slot(seq_id, start + offset))
            self.num_cached[seq_id] = start + len(token_ids)
            seq_lens.append(start + len(token_ids))
            query_start_loc.append(query_start_loc[-1] + len(token_ids))
        input_ids += [0] * num_padding
        positions += [0] * num_padding
        slots += [PAD_SLOT] * num_padding
        max_blocks = max(len(self.block_tables[seq_id]) for seq_id, _ in chunks) + 1  # + a padded column
        block_tables = torch.full((len(chunks), max_blocks), -1, dtype=torch.int32)
        for row, (seq_id, _) in enumerate(chunks):
            table = self.block_tables[seq_id]
            block_tables[row, :len(table)] = torch.tensor(table, dtype=torch.int32)
        metadata = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            block_tables=block_tables,
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            query_start_loc=torch.tensor(query_start_loc, dtype=torch.int32),
            max_query_len=max(len(token_ids) for _, token_ids in chunks),
            max_seq_len=max(seq_lens),
            num_actual_tokens=query_start_loc[-1] if num_padding else None,
        )
        return torch.tensor(input_ids, dtype=torch.int64), torch.tensor(positions, dtype=torch.int64), metadata

    def greedy(self, seq_id: int, prompt: list[int], max_tokens: int,
               prefill_split: int | None = None) -> tuple[list[int], torch.Tensor]:
        """Greedy decoding of one sequence: prefill (in two chunks if prefill_split), then one token
        per step. Returns (generated ids, fp32 logits of each generation step [max_tokens, vocab])."""
        if prefill_split is None:
            logits = self.step([(seq_id, prompt)])[-1:]
        else:
            self.step([(seq_id, prompt[:prefill_split])])
            logits = self.step([(seq_id, prompt[prefill_split:])])[-1:]
        steps = [logits[0]]
        tokens = [int(logits[0].argmax())]
        while len(tokens) < max_tokens:
            logits = self.step([(seq_id, tokens[-1:])])
            steps.append(logits[0])
            tokens.append(int(logits[0].argmax()))
        return tokens, torch.stack(steps)
