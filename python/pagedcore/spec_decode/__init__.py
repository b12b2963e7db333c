"""Speculative decoding: draft tokens proposed cheaply, verified by one target forward (see
docs/speculative-decoding.md). config.py (SpeculativeConfig), ngram_proposer.py, draft_proposer.py
(K batched one-token forwards of a draft into scratch blocks), draft_model.py (a second model under
the target's block ids; proposal_kv.py: its follow reuses the proposal's K/V), layer_skip.py (the
target's first N layers), draft_setup.py (building the draft, KV sizing), rejection_sampler.py,
speculator.py (the engine hooks), stats.py (metrics counters)."""

from pagedcore.spec_decode.config import SpeculativeConfig
from pagedcore.spec_decode.speculator import Speculator, speculation_eligible
from pagedcore.spec_decode.stats import SpecDecodeStats

__all__ = ["SpeculativeConfig", "Speculator", "SpecDecodeStats", "speculation_eligible"]
