"""Who is who in a parallel model: the layout (tensor x pipeline sizes) and one rank's place in it.

Ranks are numbered stage by stage: rank = pp_rank * tp_size + tp_rank. Rank 0 runs the first layers
of the first tensor shard; the last stage's ranks produce the logits (each its vocabulary slice)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ParallelLayout:
    tp_size: int = 1   # --tensor-parallel-size: ranks that split every layer
    pp_size: int = 1   # --pipeline-parallel-size: stages of contiguous layers

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    def rank_info(self, rank: int) -> RankInfo:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside a world of {self.world_size}")
        return RankInfo(rank=rank, tp_rank=rank % self.tp_size, pp_rank=rank // self.tp_size, layout=self)

    def stage_ranks(self, pp_rank: int) -> list[int]:
        """The ranks of one pipeline stage (its tensor-parallel group)."""
        return [pp_rank * self.tp_size + t for t in range(self.tp_size)]


@dataclass(frozen=True)
class RankInfo:
    rank: int
    tp_rank: int
    pp_rank: int
    layout: ParallelLayout

    @property
    def tp_size(self) -> int:
        return self.layout.tp_size

    @property
    def pp_size(self) -> int:
        return self.layout.pp_size

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.layout.pp_size - 1
