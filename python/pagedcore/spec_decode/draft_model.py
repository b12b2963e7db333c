"""`DraftModel` (method "draft_model"): a second model proposes, with its own paged KV cache indexed
by the target's block ids.

One block pool, one block table per sequence: block id b holds the target's K/V of its tokens in the
target's cache and the draft's K/V of the same tokens in the draft's cache (a block id costs target +
draft bytes; the KV sizing divides the one budget by that sum). The draft follows every step the
target runs (`observe_step`): the same StepInput, so the same slots, block copies and swaps, and its
KV is valid wherever the target's is: after chunked prefill, prefix-cache hits, rolled-back drafts
(both rewrite those slots later), preemption by recompute (both recompute) and by swap (both swap).

    step t:  target forward (rows R, slots S)  +  draft forward over the same rows R, slots S (no logits)
             verify, update ─▶ propose: K single-token draft forwards into scratch blocks (draft_proposer.py)

The draft cache has `scratch` blocks past the scheduler's num_blocks for the proposals. If steps ran
without the draft (the speculator unplugged, as `bench latency` does for its "off" runs), the draft
KV of blocks computed then is missing; the draft notices the gap in step ids and from then on
recomputes the computed prefix of each sequence it has not followed ("catch-up" rows in the first
step it sees that sequence), so a prefix-cache hit on such a block costs draft time, never acceptance.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import numpy as np
import torch

from pagedcore.engine import kv_cache as kvc
from pagedcore.engine.model_runner import ModelRunner
from pagedcore.engine.step_input import StepInput
from pagedcore.loader.weight_memory import describe as describe_weights
from pagedcore.spec_decode.draft_proposer import DraftProposer
from pagedcore.spec_decode.proposal_kv import reuse_proposal_kv

logger = logging.getLogger(__name__)

_NO_ROWS = np.zeros(0, dtype=np.int64)
_NO_MOVES = np.zeros((0, 2), dtype=np.int32)


def draft_load_dtype(sc, engine_dtype: str) -> str:
    """The dtype the draft is loaded with: its own "dtype" field when given; "auto" (as stored) for a
    .gguf draft or a quantized one (quantized weights run fp32 activations); else the engine's dtype."""
    from pagedcore.loader.source import resolve_source

    if sc.dtype != "auto":
        return sc.dtype
    if sc.quantization is not None or resolve_source(sc.model).format == "gguf":
        return "auto"
    return engine_dtype


def _vocab_mismatch(target_tok, draft_tok) -> str:
    """'' when the tokenizers map the same strings to the same ids (or one is absent), else why not."""
    if target_tok is None or draft_tok is None or not hasattr(target_tok, "get_vocab") \
            or not hasattr(draft_tok, "get_vocab"):
        return ""
    a, b = target_tok.get_vocab(), draft_tok.get_vocab()
    if a == b:
        return ""
    differ = sorted(set(a.items()) ^ set(b.items()), key=lambda kv: kv[1])[:3]
    return f"their tokenizers differ ({len(a)} vs {len(b)} tokens; e.g. {differ})"


class DraftModel:
    method = "draft_model"

    def __init__(self, config, target_loaded, scratch_blocks: int):
        """config: the EngineConfig (dtype resolved); target_loaded: the target's LoadedModel."""
        from pagedcore.loader import load_model

        sc = config.speculative_config
        loaded = load_model(sc.model, dtype=draft_load_dtype(sc, config.dtype), quantization=sc.quantization)
        mc, tmc = loaded.config, target_loaded.config
        if mc.vocab_size != tmc.vocab_size:
            raise ValueError(f"speculative_config.model {sc.model!r} has a vocabulary of {mc.vocab_size} tokens, "
                             f"the target {tmc.vocab_size}; a draft model must share the target's vocabulary "
                             "(the same tokenizer): pick a draft from the target's model family")
        mismatch = _vocab_mismatch(target_loaded.tokenizer, loaded.tokenizer)
        if mismatch:
            raise ValueError(f"speculative_config.model {sc.model!r} does not share the target's vocabulary: "
                             f"{mismatch}; pick a draft trained with the target's tokenizer")
        if mc.max_position_embeddings < config.max_model_len:
            raise ValueError(f"speculative_config.model {sc.model!r} handles {mc.max_position_embeddings} positions, "
                             f"fewer than max_model_len ({config.max_model_len}); lower --max-model-len")
        self.model = loaded.model
        self.target_model = target_loaded.model  # the kernels' threading is chosen for both (ops/kernel_threading.py)
        if torch.device(config.device).type == "cuda":
            self.model.to(config.device)
        self.model_config = mc
        self.device = torch.device(config.device)
        # The draft's own layers, heads and activation dtype (a GGUF draft as stored: fp32 under a bf16 target).
        self.spec = kvc.KVCacheSpec.of(mc, config.block_size, mc.dtype)
        self.weight_bytes = dict(loaded.weight_bytes)           # format -> resident bytes of the draft
        self.target_weight_bytes = sum(target_loaded.weight_bytes.values())   # for the log, side by side
        self.name = os.path.basename(loaded.source.path) if loaded.source is not None else str(sc.model)
        self.scratch_blocks = scratch_blocks
        self.num_speculative_tokens = sc.num_speculative_tokens
        self.extra_target_blocks = 0          # the target's cache needs no scratch
        self.runner: ModelRunner | None = None
        self.proposer: DraftProposer | None = None
        self._scheduler = None
        self._last_step_id = 0
        self._stale = False                   # steps ran unseen: catch up sequences not followed since
        self._followed: set[int] = set()

    # -- sizing ------------------------------------------------------------------------------------
    @property
    def bytes_per_block(self) -> int:
        """What a block id costs in the draft's cache, on top of the target's."""
        return self.spec.bytes_per_block

    @property
    def scratch_bytes(self) -> int:
        return self.scratch_blocks * self.spec.bytes_per_block

    def describe(self, num_blocks: int) -> str:
        return (f"draft model {self.name} ({describe_weights(self.weight_bytes)}, the target's "
                f"{self.target_weight_bytes / 1e6:.1f} MB; {self.model_config.dtype} activations and KV): "
                f"{self.spec.bytes_per_token_per_layer} B/token/layer x "
                f"{self.spec.num_layers} layers, "
                f"{self.spec.bytes_per_block / 1024:.1f} KiB per block id, same {num_blocks} block ids "
                f"({num_blocks * self.spec.bytes_per_block / kvc.GiB:.2f} GiB) + {self.scratch_blocks} scratch blocks "
                f"for proposals ({self.scratch_bytes / kvc.GiB:.3f} GiB)")

    def add_to(self, report):
        """report: the target worker's MemoryReport -> the same with the draft's bytes filled in."""
        runner = self.runner
        kv = 0 if runner is None or runner.kv_cache is None else runner.kv_cache.nbytes
        swap = 0 if runner is None or runner.cpu_kv_cache is None else runner.cpu_kv_cache.nbytes
        return dataclasses.replace(report, draft_weight_bytes=sum(self.weight_bytes.values()),
                                   draft_kv_cache_bytes=kv, draft_swap_bytes=swap)

    # -- set-up ------------------------------------------------------------------------------------
    def bind(self, target_kv_cache: torch.Tensor, num_blocks: int, num_cpu_blocks: int, scheduler) -> None:
        """Allocates the draft's cache (num_blocks + scratch; a swap pool of num_cpu_blocks)."""
        cache = kvc.allocate(self.spec, num_blocks + self.scratch_blocks, self.device)
        cpu_cache = (kvc.allocate(self.spec, num_cpu_blocks, "cpu", pin_memory=self.device.type == "cuda")
                     if num_cpu_blocks else None)
        self.runner = ModelRunner(self.model, self.device, also_runs=(self.target_model,))
        self.runner.bind_kv_cache(cache, cpu_cache)
        scratch = np.arange(num_blocks, num_blocks + self.scratch_blocks, dtype=np.int32)
        self.proposer = DraftProposer(self._logits, cache, scratch, self.num_speculative_tokens)
        self._scheduler = scheduler
        self._last_step_id = scheduler.stats().num_steps

    def _logits(self, input_ids: torch.Tensor, positions: torch.Tensor, md) -> torch.Tensor:
        hidden = self.model(input_ids, positions, self.runner.kv_cache, md)      # [A, hidden]
        return self.model.compute_logits(hidden)                                  # fp32 [A, V]

    # -- following the target ----------------------------------------------------------------------
    def observe_step(self, step: StepInput, out) -> None:
        """The draft's forward over this step's rows (the target's slots; no logits): block moves first."""
        records, self.proposer.records = self.proposer.records, {}   # proposals made after the last step
        if out.step_id != self._last_step_id + 1:
            records = {}
            if not self._stale:
                logger.info("speculative decoding: %d step(s) ran without the draft model; it now recomputes "
                            "the computed prefix of each sequence it has not followed",
                            out.step_id - self._last_step_id - 1)
            self._stale = True
            self._followed.clear()
        self._last_step_id = out.step_id
        seq_ids = out.seq_ids
        for sid in out.preempted_seq_ids.tolist():
            self._followed.discard(sid)
        # Block moves first (a copy-on-write or swap-in must land before reused K/V is written), then
        # the rows: those a proposal already computed are copied, not run again (proposal_kv.py).
        self.runner.move_blocks(step)
        shadow = dataclasses.replace(step, logits_indices=_NO_ROWS, blocks_to_swap_out=_NO_MOVES,
                                     blocks_to_swap_in=_NO_MOVES, blocks_to_copy=_NO_MOVES)
        if records:
            shadow = reuse_proposal_kv(shadow, seq_ids, records, self.runner.kv_cache)
        if self._stale:
            shadow = self._with_catch_up(shadow, out)
        self.runner.execute(shadow)
        self._followed.update(seq_ids.tolist())
        if len(self._followed) > 4 * max(1, len(seq_ids)) + 1024:
            self._followed = set(seq_ids.tolist())   # forget finished ones (at worst: one more catch-up)

    def _with_catch_up(self, step: StepInput, out) -> StepInput:
        """step, with rows for positions [0, c) prepended to each unfollowed sequence that starts at c > 0."""
        computed = out.num_computed_tokens                                       # int32 [num_seqs]
        todo = [i for i, sid in enumerate(out.seq_ids.tolist()) if computed[i] > 0 and sid not in self._followed]
        if not todo:
            return step
        B = self.spec.block_size
        qsl = step.query_start_loc
        ids, pos, slots, lens = [], [], [], []
        for i in range(len(out.seq_ids)):
            c = int(computed[i]) if i in todo else 0
            if c:
                tokens = self._scheduler.get_sequence(int(out.seq_ids[i])).token_ids[:c]
                p = np.arange(c, dtype=np.int64)                                   # [c]
                ids.append(np.asarray(tokens, dtype=np.int64))
                pos.append(p)
                slots.append(step.block_tables[i, p // B].astype(np.int64) * B + p % B)
            ids.append(step.input_ids[qsl[i]:qsl[i + 1]])
            pos.append(step.positions[qsl[i]:qsl[i + 1]])
            slots.append(step.slot_mapping[qsl[i]:qsl[i + 1]])
            lens.append(c + int(qsl[i + 1] - qsl[i]))
        query_start_loc = np.zeros(len(lens) + 1, dtype=np.int32)                 # [num_seqs + 1]
        query_start_loc[1:] = np.cumsum(lens)
        input_ids = np.concatenate(ids)
        return dataclasses.replace(step, input_ids=input_ids, positions=np.concatenate(pos),
                                   slot_mapping=np.concatenate(slots), query_start_loc=query_start_loc,
                                   num_tokens=int(input_ids.shape[0]), max_query_len=max(lens))
