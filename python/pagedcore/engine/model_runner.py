"""ModelRunner: one StepInput in, the logits of its sampled rows out.

The step's arrays are wrapped with torch.from_numpy (no copies, no per-token Python); block
moves run in the order the scheduler promised: swap out, swap in, then copy-on-write copies.
"""

from __future__ import annotations

import numpy as np
import torch

from pagedcore.engine.step_input import StepInput
from pagedcore.ops import attention as kernels
from pagedcore.ops import kernel_threading
from pagedcore.layers.attention import AttentionMetadata
from pagedcore.sampling.logit_edits import LogitEdits
from pagedcore.sampling.logprobs import RawLogitRows
from pagedcore.sampling.row_sampling import RowSampling


class ModelRunner:
    def __init__(self, model: torch.nn.Module, device: torch.device | str = "cpu",
                 also_runs: tuple[torch.nn.Module, ...] = ()):
        """also_runs: other models this process steps with this one (a speculative draft's target): the CPU
        kernels' threading is chosen for all of them."""
        self.model = model
        self.device = torch.device(device)
        # Set by bind_kv_cache once the cache is sized (the sizing runs profile_forward first).
        self.kv_cache: torch.Tensor | None = None      # [num_layers, 2, num_blocks, num_kv_heads, block_size, head_dim]
        self.cpu_kv_cache: torch.Tensor | None = None  # same layout, the swap pool's blocks; None without swap space
        self.lora_manager = None  # a pagedcore.lora.LoRAManager when LoRA is enabled: sets each step's adapter rows
        self.kernel_threading = None   # "pool" | "openmp" on the CPU: the kernels' own pool where no library GEMM runs
        if self.device.type == "cpu":
            self.kernel_threading = kernel_threading.apply_for_models(model, *also_runs)

    def bind_kv_cache(self, kv_cache: torch.Tensor, cpu_kv_cache: torch.Tensor | None) -> None:
        self.kv_cache = kv_cache
        self.cpu_kv_cache = cpu_kv_cache

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(array)
        return t if self.device.type == "cpu" else t.to(self.device, non_blocking=True)

    def move_blocks(self, step: StepInput) -> None:
        if len(step.blocks_to_swap_out):
            kernels.swap_blocks(self.kv_cache, self.cpu_kv_cache, torch.from_numpy(step.blocks_to_swap_out))
        if len(step.blocks_to_swap_in):
            kernels.swap_blocks(self.cpu_kv_cache, self.kv_cache, torch.from_numpy(step.blocks_to_swap_in))
        if len(step.blocks_to_copy):
            # On the host: the copy kernels check the ids and order dependent rows there.
            kernels.copy_blocks(self.kv_cache, torch.from_numpy(step.blocks_to_copy))

    @torch.inference_mode()
    def profile_forward(self, scratch_kv_cache: torch.Tensor, num_tokens: int, num_seqs: int, seq_len: int,
                        num_logits_rows: int) -> None:
        """A dummy forward of the largest step (num_seqs sequences of seq_len tokens, num_tokens in all)
        through scratch_kv_cache (the KV cache layout, blocks enough for num_seqs * ceil(seq_len /
        block_size)), then logits for num_logits_rows rows: its peak memory is what the KV cache
        must leave free."""
        block_size = scratch_kv_cache.shape[4]
        blocks_per_seq = -(-seq_len // block_size)
        positions = torch.arange(seq_len).repeat(num_seqs)[:num_tokens]                  # [num_tokens]
        seq_of_token = torch.arange(num_seqs).repeat_interleave(seq_len)[:num_tokens]    # [num_tokens]
        block_tables = torch.arange(num_seqs * blocks_per_seq, dtype=torch.int32).view(num_seqs, blocks_per_seq)
        slot_mapping = (block_tables[seq_of_token, positions // block_size].long() * block_size
                        + positions % block_size)
        lens = torch.bincount(seq_of_token, minlength=num_seqs).to(torch.int32)          # [num_seqs]
        query_start_loc = torch.zeros(num_seqs + 1, dtype=torch.int32)
        query_start_loc[1:] = lens.cumsum(0)
        attn_metadata = AttentionMetadata(
            slot_mapping=slot_mapping.to(self.device), block_tables=block_tables.to(self.device),
            seq_lens=lens.to(self.device), query_start_loc=query_start_loc.to(self.device),
            max_query_len=int(lens.max()), max_seq_len=int(lens.max()))
        input_ids = torch.zeros(num_tokens, dtype=torch.long, device=self.device)
        hidden = self.model(input_ids, positions.to(self.device), scratch_kv_cache, attn_metadata)
        self.model.compute_logits(hidden[:num_logits_rows])

    @torch.inference_mode()
    def execute_fused(self, step: StepInput, sampling: RowSampling | None = None,
                      edits: LogitEdits | None = None, raw: RawLogitRows | None = None) -> np.ndarray | None:
        """The step's tokens (int64 [len(step.logits_indices)]: each row's argmax, or drawn with
        sampling's inputs; after edits' penalties, bias and bans when given; raw's rows copied out
        before any edit) from one C++ call (models/greedy_decode.py), or None where that path does not
        take the step: nothing has run then (no noise drawn either), and the caller runs execute() and
        samples. The caller has checked that the rows need nothing else (no beams, grammar, drafts or
        forks) and that no other logits rows are asked for."""
        decoder = self._greedy_decoder() if step.num_tokens else None
        if decoder is None:
            return None
        if self.lora_manager is not None:  # the step's adapter rows, read by the call as the Python step reads them
            self.lora_manager.prepare(step.adapter_ids, step.query_start_loc)
        if not decoder.takes(step.num_tokens, len(step.logits_indices), self.kv_cache, sampling, edits, raw):
            return None
        self.move_blocks(step)
        return decoder(step, self.kv_cache, sampling, edits, raw)

    def _greedy_decoder(self):
        """The model's one-call decoder as its weights are now, or None (a GPU, a model without one)."""
        if self.device.type != "cpu":
            return None
        offer = getattr(self.model, "greedy_decoder", None)
        return offer() if offer is not None else None

    def can_multi_step(self) -> bool:
        # Multi-step keeps to engines without LoRA: its call takes no adapter rows.
        return self.lora_manager is None and self._greedy_decoder() is not None

    @torch.inference_mode()
    def execute_multi_step(self, step: StepInput, sampling: RowSampling | None = None,
                           edits: LogitEdits | None = None, ban_steps: np.ndarray | None = None,
                           raw=None) -> np.ndarray | None:
        """Decode steps in one C++ call over a step of decode-and-placeholder tokens (engine/multi_step.py;
        sampling: a row a sequence, None for argmaxes; edits and ban_steps: the first step's logit edits
        and each sequence's min_tokens ban steps; raw: multi_step.RawRows for logprobs): int64
        [step.num_tokens], or None where the one-call decoder does not take the step (nothing run, no noise
        drawn)."""
        decoder = self._greedy_decoder() if self.lora_manager is None else None
        num_seqs = len(step.seq_lens)  # rows of each one-token step
        if decoder is None or step.num_tokens == 0 or not decoder.takes(num_seqs, num_seqs, self.kv_cache):
            return None
        self.move_blocks(step)
        return decoder.run_steps(step, self.kv_cache, sampling, edits, ban_steps, raw)

    @torch.inference_mode()
    def execute(self, step: StepInput) -> torch.Tensor:
        """Runs the forward of one step. Returns fp32 logits [num_logits_rows, vocab], the rows of
        step.logits_indices (sampled rows, then prompt-logprob rows)."""
        self.move_blocks(step)
        if step.num_tokens == 0:
            return torch.empty(0, 0)
        attn_metadata = AttentionMetadata(
            slot_mapping=self._tensor(step.slot_mapping),        # int64 [num_tokens]
            block_tables=self._tensor(step.block_tables),        # int32 [num_seqs, max_blocks]
            seq_lens=self._tensor(step.seq_lens),                # int32 [num_seqs]
            query_start_loc=self._tensor(step.query_start_loc),  # int32 [num_seqs + 1]
            max_query_len=step.max_query_len,
            max_seq_len=step.max_seq_len,
        )
        if self.lora_manager is not None:
            self.lora_manager.prepare(step.adapter_ids, step.query_start_loc)
        hidden = self.model(self._tensor(step.input_ids), self._tensor(step.positions), self.kv_cache,
                            attn_metadata)                       # [num_tokens, hidden]
        rows = step.logits_indices                               # int64 [num_logits_rows]
        if len(rows) == 0:
            return torch.empty(0, 0)
        if len(rows) == step.num_tokens and rows[0] == 0 and rows[-1] == step.num_tokens - 1 \
                and np.array_equal(rows, np.arange(step.num_tokens)):
            sampled_hidden = hidden                             # all-decode step: no gather needed
        else:
            sampled_hidden = hidden.index_select(0, self._tensor(rows))  # [num_rows, hidden]
        return self.model.compute_logits(sampled_hidden)        # fp32 [num_rows, vocab]
