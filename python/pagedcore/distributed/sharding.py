"""Which part of the model one rank holds: the split arithmetic of tensor and pipeline parallelism.

Pure arithmetic on ModelConfig and ParallelLayout (no torch modules). Every range is half-open,
(start, end), and contiguous; near-equal splits give the remainder to the first ranks.

Tensor parallelism splits attention by KV-head groups (a KV head and the query heads that read it
stay on one rank, so attention needs no communication), which may be uneven:

    SmolLM2-135M, 9 query heads / 3 KV heads (groups of 3), TP=2:
        rank 0: KV heads [0, 2) -> query heads [0, 6)      rank 1: KV head [2, 3) -> query heads [6, 9)

With more ranks than KV heads each KV head is replicated on tp / num_kv_heads ranks, which split its
group's query heads (needs tp % num_kv_heads == 0 and num_heads % tp == 0):

    4 query heads / 1 KV head, TP=2:  rank 0: KV head 0, query heads [0, 2)   rank 1: KV head 0, [2, 4)

The MLP's intermediate columns and the vocabulary (embedding rows, LM head rows) split near-equally.
Pipeline parallelism gives each stage a contiguous range of layers; the first stage holds the
embedding, the last the final norm and the LM head (and, with tied embeddings, its embedding shard).
"""

from __future__ import annotations

import dataclasses

from pagedcore.distributed.rank import ParallelLayout, RankInfo
from pagedcore.model_config import SUPPORTED_DTYPES, ModelConfig

Range = tuple[int, int]  # (start, end), half-open


def split_range(size: int, num_parts: int, part: int) -> Range:
    """Part `part` of [0, size) cut into num_parts contiguous near-equal pieces (sizes differ by at
    most one; the first size % num_parts pieces are the larger)."""
    if num_parts <= 0 or not 0 <= part < num_parts:
        raise ValueError(f"part {part} of {num_parts} parts does not exist")
    base, extra = divmod(size, num_parts)
    start = part * base + min(part, extra)
    return start, start + base + (1 if part < extra else 0)


def vocab_range(vocab_size: int, tp_size: int, tp_rank: int) -> Range:
    """The token ids whose embedding rows and logits columns this tensor-parallel rank holds."""
    return split_range(vocab_size, tp_size, tp_rank)


def layer_range(num_layers: int, pp_size: int, pp_rank: int) -> Range:
    """The decoder layers pipeline stage pp_rank runs (global layer indices)."""
    return split_range(num_layers, pp_size, pp_rank)


def intermediate_range(intermediate_size: int, tp_size: int, tp_rank: int) -> Range:
    """The MLP columns (rows of gate and up, columns of down) this rank holds."""
    return split_range(intermediate_size, tp_size, tp_rank)


def kv_head_range(num_kv_heads: int, tp_size: int, tp_rank: int) -> Range:
    """The KV heads this rank holds: a near-equal split of the heads when tp_size <= num_kv_heads,
    else the one head this rank replicates (tp_size / num_kv_heads ranks share each head)."""
    if tp_size <= num_kv_heads:
        return split_range(num_kv_heads, tp_size, tp_rank)
    head = tp_rank // (tp_size // num_kv_heads)
    return head, head + 1


def q_head_range(num_heads: int, num_kv_heads: int, tp_size: int, tp_rank: int) -> Range:
    """The query heads this rank holds: exactly those reading its KV heads (all of their groups),
    or, with a replicated KV head, this rank's equal share of that head's group."""
    if tp_size <= num_kv_heads:
        group = num_heads // num_kv_heads
        start, end = kv_head_range(num_kv_heads, tp_size, tp_rank)
        return start * group, end * group
    return split_range(num_heads, tp_size, tp_rank)  # equal: num_heads % tp_size == 0 was checked


def check_layout(config: ModelConfig, layout: ParallelLayout) -> None:
    """Raises ValueError, naming the flag and the fix, for a layout this model cannot be split into.
    Run before any weight loads."""
    tp, pp = layout.tp_size, layout.pp_size
    if tp < 1 or pp < 1:
        raise ValueError(f"--tensor-parallel-size ({tp}) and --pipeline-parallel-size ({pp}) must be >= 1")
    heads, kv_heads = config.num_heads, config.num_kv_heads
    if tp > kv_heads and (tp % kv_heads != 0 or heads % tp != 0):
        fits = [n for n in range(1, heads + 1) if n <= kv_heads or (n % kv_heads == 0 and heads % n == 0)]
        raise ValueError(
            f"--tensor-parallel-size {tp} does not split this model's attention: it has {heads} query heads "
            f"and {kv_heads} KV heads, and more ranks than KV heads needs the rank count to be a multiple of "
            f"the KV heads and to divide the query heads; use --tensor-parallel-size in {fits}")
    for name, size in (("intermediate_size", config.intermediate_size), ("vocab_size", config.vocab_size),
                       ("hidden_size", config.hidden_size)):
        if tp > size:
            raise ValueError(f"--tensor-parallel-size {tp} exceeds the model's {name} ({size}); use fewer ranks")
    if pp > config.num_layers:
        raise ValueError(f"--pipeline-parallel-size {pp} exceeds the model's {config.num_layers} layers: every "
                         f"stage needs at least one; use --pipeline-parallel-size <= {config.num_layers}")


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """One rank's share of a model (global indices; every range (start, end))."""

    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    head_dim: int
    q_heads: Range
    kv_heads: Range
    intermediate: Range
    vocab: Range
    layers: Range
    tie_word_embeddings: bool

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    @property
    def has_embedding(self) -> bool:
        """The first stage looks tokens up; a tied last stage reads the table as its LM head."""
        return self.is_first_stage or (self.is_last_stage and self.tie_word_embeddings)

    @property
    def num_layers(self) -> int:
        return self.layers[1] - self.layers[0]

    @property
    def q_rows(self) -> Range:
        """Rows of q_proj (columns of o_proj) this rank holds."""
        return self.q_heads[0] * self.head_dim, self.q_heads[1] * self.head_dim

    @property
    def kv_rows(self) -> Range:
        """Rows of k_proj and of v_proj this rank holds."""
        return self.kv_heads[0] * self.head_dim, self.kv_heads[1] * self.head_dim


def shard_plan(config: ModelConfig, rank: RankInfo) -> ShardPlan:
    check_layout(config, rank.layout)
    tp, t = rank.tp_size, rank.tp_rank
    return ShardPlan(
        tp_rank=t, tp_size=tp, pp_rank=rank.pp_rank, pp_size=rank.pp_size, head_dim=config.head_dim,
        q_heads=q_head_range(config.num_heads, config.num_kv_heads, tp, t),
        kv_heads=kv_head_range(config.num_kv_heads, tp, t),
        intermediate=intermediate_range(config.intermediate_size, tp, t),
        vocab=vocab_range(config.vocab_size, tp, t),
        layers=layer_range(config.num_layers, rank.pp_size, rank.pp_rank),
        tie_word_embeddings=config.tie_word_embeddings,
    )


def _span(r: Range) -> int:
    return r[1] - r[0]


def shard_config(config: ModelConfig, rank: RankInfo) -> ModelConfig:
    """The ModelConfig of what this rank's modules hold: its query heads, KV heads, intermediate
    columns and layers (what its KV cache and decoder layers are built from). vocab_size stays the
    full vocabulary: token ids are global; the rank's embedding rows / logits columns are vocab_range."""
    plan = shard_plan(config, rank)
    return dataclasses.replace(config, num_heads=_span(plan.q_heads), num_kv_heads=_span(plan.kv_heads),
                               intermediate_size=_span(plan.intermediate), num_layers=plan.num_layers)


def kv_block_bytes(config: ModelConfig, layout: ParallelLayout, block_size: int, dtype: str) -> int:
    """Bytes one KV block id costs the machine: every rank allocates it for its own layers and KV
    heads (K and V, head_dim each), summed over all ranks of the layout. Replicated KV heads count
    once per rank holding them."""
    element_size = SUPPORTED_DTYPES[dtype].itemsize
    check_layout(config, layout)
    total = 0
    for rank in range(layout.world_size):
        info = layout.rank_info(rank)
        num_layers = _span(layer_range(config.num_layers, layout.pp_size, info.pp_rank))
        num_kv_heads = _span(kv_head_range(config.num_kv_heads, layout.tp_size, info.tp_rank))
        total += 2 * num_layers * num_kv_heads * block_size * config.head_dim * element_size
    return total
