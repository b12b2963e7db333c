"""`LayerSkipDraft` (method "layer_skip"): self-speculation, the target's first N layers plus its own
final norm and LM head as the draft. No second model, no second cache: the draft shares the target's
weights and the KV of those N layers.

Why reading the target's KV is exact: the K/V of layer l < N at position p is a function of the
tokens at positions <= p through layers 0 .. l only, and those layers are the draft's own. So the
values the target's forward wrote there (prompt, accepted tokens) are the values the draft would
have computed itself; the draft needs no forward of its own over the target's rows (unlike
draft_model), and a prefix-cache hit, a swap or a recompute covers it with the target's KV.

Proposals (draft_proposer.py) write positions n .. n + K - 1 of layers 0 .. N-1 into scratch blocks
past the scheduler's num_blocks in the target's cache tensor, never into the real blocks. The
verification forward then computes those positions into the real slots for all L layers; for the
tokens it accepts, its layer-l < N values are the ones the proposal computed (the same function of
the same tokens; at most last-bit rounding differs between a 1-row and a (K+1)-row forward), and
rejected positions are written again when the sequence gets there. So the target never reads
anything the draft alone wrote, and greedy output is the target's, token for token.

    cache tensor [L, 2, num_blocks + scratch, ...]:
      layers 0 .. N-1 : target writes (every step) ; draft reads (proposals), writes scratch only
      layers N .. L-1 : target only
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from pagedcore.layers.decoder_stack import DecoderStack, layer_tensors, stack_weight
from pagedcore.spec_decode.draft_proposer import DraftProposer

logger = logging.getLogger(__name__)


class LayerSkipDraft:
    method = "layer_skip"

    def __init__(self, config, target_loaded, scratch_blocks: int):
        sc = config.speculative_config
        mc = target_loaded.config
        self.num_layers = sc.num_layers
        if self.num_layers >= mc.num_layers:
            raise ValueError(f"speculative_config.num_layers ({self.num_layers}) must be below the target's "
                             f"{mc.num_layers} layers (the draft runs the first num_layers of them); lower it")
        if config.enable_lora:
            raise ValueError('speculative_config.method "layer_skip" does not run with LoRA (the draft would run '
                             "the adapters' layers without their per-step rows); drop --enable-lora or use "
                             '"ngram" / "draft_model"')
        self.model = target_loaded.model
        self.scratch_blocks = scratch_blocks
        self.extra_target_blocks = scratch_blocks   # the scratch lives in the target's cache tensor
        self.num_speculative_tokens = sc.num_speculative_tokens
        self.proposer: DraftProposer | None = None
        self._kv: torch.Tensor | None = None
        self._stack: DecoderStack | None = None
        self._target_bytes_per_block = 0

    @property
    def bytes_per_block(self) -> int:
        return 0   # shares the target's KV

    @property
    def scratch_bytes(self) -> int:
        return self.scratch_blocks * self._target_bytes_per_block

    def set_target_spec(self, spec) -> None:
        self._target_bytes_per_block = spec.bytes_per_block

    def describe(self, num_blocks: int) -> str:
        return (f"layer_skip draft: the target's first {self.num_layers} layers and their KV (no bytes of its own) "
                f"+ {self.scratch_blocks} scratch blocks for proposals in the target's cache "
                f"({self.scratch_bytes / 1024**3:.3f} GiB)")

    def add_to(self, report):
        """No bytes of its own: its weights and KV are the target's (its scratch is in the target's cache)."""
        return report

    def bind(self, target_kv_cache: torch.Tensor, num_blocks: int, num_cpu_blocks: int, scheduler) -> None:
        """target_kv_cache [L, 2, num_blocks + scratch, ...]: the proposals read and write its first N layers."""
        self._kv = target_kv_cache[:self.num_layers]          # [N, 2, num_blocks + scratch, ...], a view
        scratch = np.arange(num_blocks, num_blocks + self.scratch_blocks, dtype=np.int32)
        self.proposer = DraftProposer(self._logits, self._kv, scratch, self.num_speculative_tokens)

    def observe_step(self, step, out) -> None:
        """Nothing to follow: the target's own forward writes the KV of the draft's layers."""

    def _decoder_stack(self) -> DecoderStack | None:
        """The C++ decoder stack over the first N layers, where the target's own stack runs."""
        inner = self.model.model
        if not inner.decoder_stack_status.supported:
            return None
        if self._stack is None or not self._stack.matches(stack_weight(inner.layers[0].self_attn.qkv_proj)):
            cfg = inner.config
            self._stack = DecoderStack([layer_tensors(layer) for layer in inner.layers[:self.num_layers]],
                                       hidden_size=cfg.hidden_size, num_heads=cfg.num_heads,
                                       num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                                       intermediate_size=cfg.intermediate_size, rms_norm_eps=cfg.rms_norm_eps,
                                       attn_scale=inner.layers[0].self_attn.attn.scale)
        return self._stack

    def _logits(self, input_ids: torch.Tensor, positions: torch.Tensor, md) -> torch.Tensor:
        hidden = self.model.model.forward_first_layers(input_ids, positions, self._kv, md, self.num_layers,
                                                        self._decoder_stack())   # [A, hidden]
        return self.model.compute_logits(hidden)                                     # fp32 [A, V]
