"""Counters of speculative decoding: vLLM's spec_decode metrics, cumulative and for the last step."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecDecodeStats:
    num_speculative_tokens: int                 # K: the most drafts per sequence per step
    num_drafts: int = 0                         # verifications (a sequence with >= 1 draft in a step)
    num_draft_tokens: int = 0                   # drafts verified
    num_accepted_tokens: int = 0                # drafts the target agreed with
    accepted_per_pos: list[int] = field(default_factory=list)  # [K] drafts accepted at position i
    step_num_draft_tokens: int = 0              # the last step's drafts
    step_num_accepted_tokens: int = 0           # the last step's accepted drafts
    step_num_drafts: int = 0                    # the last step's verifications
    step_accepted_per_pos: list[int] = field(default_factory=list)  # [K] the last step's, per position

    def __post_init__(self):
        if not self.accepted_per_pos:
            self.accepted_per_pos = [0] * self.num_speculative_tokens
        self.step_accepted_per_pos = [0] * self.num_speculative_tokens

    def begin_step(self) -> None:
        self.step_num_draft_tokens = self.step_num_accepted_tokens = self.step_num_drafts = 0
        self.step_accepted_per_pos = [0] * self.num_speculative_tokens

    def record(self, num_draft_tokens: int, num_accepted: int) -> None:
        """One sequence's verification: num_draft_tokens proposed, the first num_accepted accepted."""
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        self.step_num_draft_tokens += num_draft_tokens
        self.step_num_accepted_tokens += num_accepted
        self.step_num_drafts += 1
        for pos in range(num_accepted):
            self.accepted_per_pos[pos] += 1
            self.step_accepted_per_pos[pos] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per verification, the bonus/correction token included (vLLM's mean acceptance length)."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    def as_dict(self) -> dict:
        return {"num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
                "num_accepted_tokens": self.num_accepted_tokens,
                "num_accepted_tokens_per_pos": list(self.accepted_per_pos),
                "acceptance_rate": self.acceptance_rate, "mean_accepted_length": self.mean_accepted_length}


def step_record(stats: SpecDecodeStats | None, out) -> dict:
    """The step record's speculation fields (engine.last_step_timing, the trace, the metrics hook):
    verifications, drafts verified and drafts accepted in this step, accepted per draft position."""
    if stats is None or not out.num_draft_tokens:
        return {"num_drafts": 0, "num_draft_tokens": int(out.num_draft_tokens), "num_accepted_tokens": 0,
                "num_accepted_tokens_per_pos": []}
    return {"num_drafts": stats.step_num_drafts, "num_draft_tokens": stats.step_num_draft_tokens,
            "num_accepted_tokens": stats.step_num_accepted_tokens,
            "num_accepted_tokens_per_pos": list(stats.step_accepted_per_pos)}
