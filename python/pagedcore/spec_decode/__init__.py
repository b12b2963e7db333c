"""Speculative decoding: draft tokens proposed cheaply, verified by one target forward (see
docs/speculative-decoding.md). config.py (SpeculativeConfig), ngram_proposer.py, rejection_sampler.py,
speculator.py (the engine hooks), stats.py (metrics counters)."""

from pagedcore.spec_decode.config import SpeculativeConfig
from pagedcore.spec_decode.speculator import Speculator, speculation_eligible
from pagedcore.spec_decode.stats import SpecDecodeStats

__all__ = ["SpeculativeConfig", "Speculator", "SpecDecodeStats", "speculation_eligible"]
