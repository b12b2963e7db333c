"""Building the draft of draft_model / layer_skip speculation and sizing the KV cache around it.

One budget, one block pool: a block id costs the target's bytes plus the draft's (0 for layer_skip,
which shares the target's KV), and the draft's scratch blocks for proposals come off the top:

    num_blocks = (budget - scratch_blocks x scratch_block_bytes) // (target_block_bytes + draft_block_bytes)
"""

from __future__ import annotations

from pagedcore.spec_decode.config import DRAFT_METHODS
from pagedcore.spec_decode.draft_proposer import MAX_SEQS_PER_CHUNK, scratch_blocks_per_seq


def build_draft(config, loaded, target_spec, in_process: bool = True):
    """The draft (DraftModel or LayerSkipDraft) for config.speculative_config, or None (ngram, off).
    in_process: the target runs in this process (not in worker ranks). Raises ValueError, naming the
    field and the fix, for a draft that cannot run with this target."""
    sc = config.speculative_config
    if sc is None or sc.method not in DRAFT_METHODS:
        return None
    if not in_process:
        raise ValueError(f"speculative_config.method {sc.method!r} runs with the model in the engine's process "
                         "only (not in worker ranks: --distributed-executor-backend, tensor / pipeline "
                         'parallelism); use "ngram" there')
    for field in ("tensor_parallel_size", "pipeline_parallel_size"):
        if getattr(config, field, 1) > 1:
            raise ValueError(f"speculative_config.method {sc.method!r} does not run with {field} > 1 yet; use "
                             f'"ngram" speculation with parallelism, or {field}=1')
    scratch = min(config.max_num_seqs, MAX_SEQS_PER_CHUNK) * scratch_blocks_per_seq(config.block_size,
                                                                                    sc.num_speculative_tokens)
    if sc.method == "draft_model":
        from pagedcore.spec_decode.draft_model import DraftModel

        return DraftModel(config, loaded, scratch)
    from pagedcore.spec_decode.layer_skip import LayerSkipDraft

    draft = LayerSkipDraft(config, loaded, scratch)
    draft.set_target_spec(target_spec)
    return draft


def cpu_kv_cache_budget(config, draft, target_spec) -> int:
    """kv_cache.cpu_kv_cache_budget, its default capped at what max_num_seqs sequences of max_model_len
    tokens can fill with a block id costing target + draft bytes, plus the scratch."""
    from pagedcore.engine import kv_cache as kvc

    budget = kvc.cpu_kv_cache_budget(config, None)       # explicit, or the default share (uncapped)
    if config.kv_cache_memory is not None or not config.max_model_len:
        return budget
    blocks_per_seq = -(-config.max_model_len // target_spec.block_size)
    fill = config.max_num_seqs * blocks_per_seq * (target_spec.bytes_per_block + draft.bytes_per_block)
    return min(budget, fill + draft.scratch_bytes)


def num_blocks_for(draft, target_spec, budget_bytes: int) -> int:
    """Block ids that fit budget_bytes with the draft's share of each and its scratch."""
    return max(0, budget_bytes - draft.scratch_bytes) // (target_spec.bytes_per_block + draft.bytes_per_block)


def num_cpu_blocks_for(draft, target_spec, swap_bytes: int) -> int:
    """Swap-pool blocks: a swapped block id carries the draft's KV too (no scratch on the host)."""
    return swap_bytes // (target_spec.bytes_per_block + draft.bytes_per_block)
