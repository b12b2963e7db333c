"""The split arithmetic of tensor and pipeline parallelism (distributed/sharding.py) and the checkpoint
cutting built on it (distributed/shard_weights.py): every head, column, vocabulary row and layer lands
on exactly the ranks it should, sizes differ by at most one group, and layouts that cannot work are
refused naming the flag and the fix."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedcore.distributed.rank import ParallelLayout
from pagedcore.distributed.shard_weights import shard_checkpoint
from pagedcore.distributed.sharding import (check_layout, kv_block_bytes, kv_head_range, layer_range,
                                            q_head_range, shard_config, shard_plan, split_range, vocab_range)
from pagedcore.engine.kv_cache import KVCacheSpec
from pagedcore.model_config import ModelConfig


def make_config(num_heads=9, num_kv_heads=3, head_dim=64, intermediate_size=1536, num_layers=30,
                vocab_size=49152, hidden_size=576, tie_word_embeddings=True) -> ModelConfig:
    """SmolLM2-135M's shape by default (the default model)."""
    return ModelConfig(architecture="LlamaForCausalLM", hidden_size=hidden_size,
                       intermediate_size=intermediate_size, num_layers=num_layers, num_heads=num_heads,
                       num_kv_heads=num_kv_heads, head_dim=head_dim, vocab_size=vocab_size, rms_norm_eps=1e-5,
                       rope_theta=1e5, max_position_embeddings=2048, tie_word_embeddings=tie_word_embeddings)


def valid_tp(num_heads: int, num_kv_heads: int, tp: int) -> bool:
    return tp <= num_kv_heads or (tp % num_kv_heads == 0 and num_heads % tp == 0)


@given(size=st.integers(0, 10_000), num_parts=st.integers(1, 64))
def test_split_range_covers_everything_once_near_equally(size, num_parts):
    ranges = [split_range(size, num_parts, part) for part in range(num_parts)]
    assert ranges[0][0] == 0 and ranges[-1][1] == size
    assert all(ranges[i][1] == ranges[i + 1][0] for i in range(num_parts - 1))  # contiguous, in order
    sizes = [end - start for start, end in ranges]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)  # the remainder goes first


@st.composite
def attention_layouts(draw):
    num_kv_heads = draw(st.integers(1, 12))
    group = draw(st.integers(1, 8))
    tp = draw(st.integers(1, 16))
    return num_kv_heads * group, num_kv_heads, tp


@settings(max_examples=300)
@given(attention_layouts())
def test_heads_split_by_kv_groups(layout):
    num_heads, num_kv_heads, tp = layout
    group = num_heads // num_kv_heads
    if not valid_tp(num_heads, num_kv_heads, tp):
        with pytest.raises(ValueError, match="--tensor-parallel-size"):
            check_layout(make_config(num_heads=num_heads, num_kv_heads=num_kv_heads, intermediate_size=64,
                                     vocab_size=64, hidden_size=64), ParallelLayout(tp_size=tp))
        return
    kv = [kv_head_range(num_kv_heads, tp, rank) for rank in range(tp)]
    q = [q_head_range(num_heads, num_kv_heads, tp, rank) for rank in range(tp)]
    # Every query head exactly once, in rank order.
    assert [h for start, end in q for h in range(start, end)] == list(range(num_heads))
    # Each rank's query heads read only its KV heads, and it holds every KV head they read.
    for (q_start, q_end), (kv_start, kv_end) in zip(q, kv):
        assert q_end > q_start and kv_end > kv_start
        assert {h // group for h in range(q_start, q_end)} == set(range(kv_start, kv_end))
    kv_counts = Counter(h for start, end in kv for h in range(start, end))
    if tp <= num_kv_heads:  # split: each KV head on one rank, sizes within one group
        assert kv_counts == Counter(range(num_kv_heads))
        sizes = [end - start for start, end in q]
        assert max(sizes) - min(sizes) <= group
    else:  # replicated: each KV head on tp / num_kv_heads ranks, query heads equal
        assert kv_counts == Counter({h: tp // num_kv_heads for h in range(num_kv_heads)})
        assert {end - start for start, end in q} == {num_heads // tp}


@settings(max_examples=100)
@given(attention_layouts(), st.integers(1, 4), st.integers(1, 9))
def test_shard_config_of_every_rank_is_a_valid_model(layout, pp, num_layers):
    num_heads, num_kv_heads, tp = layout
    config = make_config(num_heads=num_heads, num_kv_heads=num_kv_heads, intermediate_size=101,
                         num_layers=num_layers, vocab_size=509, hidden_size=32, head_dim=8)
    parallel = ParallelLayout(tp_size=tp, pp_size=pp)
    if not valid_tp(num_heads, num_kv_heads, tp) or pp > num_layers:
        with pytest.raises(ValueError, match="--(tensor|pipeline)-parallel-size"):
            check_layout(config, parallel)
        return
    configs = [shard_config(config, parallel.rank_info(rank)) for rank in range(parallel.world_size)]
    for pp_rank in range(pp):
        stage = configs[pp_rank * tp:(pp_rank + 1) * tp]
        assert sum(c.num_heads for c in stage) == num_heads
        assert sum(c.intermediate_size for c in stage) == 101
        assert {c.num_layers for c in stage} == {layer_range(num_layers, pp, pp_rank)[1]
                                                   - layer_range(num_layers, pp, pp_rank)[0]}
    assert sum(c.num_layers for c in configs[::tp]) == num_layers
    assert all(c.vocab_size == 509 and c.head_dim == 8 for c in configs)  # token ids stay global
    assert sum(vocab_range(509, tp, t)[1] - vocab_range(509, tp, t)[0] for t in range(tp)) == 509
    # What one block id costs the machine: each rank's own layers and KV heads, summed.
    per_rank = sum(KVCacheSpec.of(c, 16, "float32").bytes_per_block for c in configs)
    assert kv_block_bytes(config, parallel, 16, "float32") == per_rank


def test_default_model_tp2_split_is_uneven_by_kv_group():
    config = make_config()  # 9 heads, 3 KV heads, intermediate 1536, 30 layers, vocab 49152
    layout = ParallelLayout(tp_size=2)
    plans = [shard_plan(config, layout.rank_info(rank)) for rank in range(2)]
    assert [p.kv_heads for p in plans] == [(0, 2), (2, 3)]
    assert [p.q_heads for p in plans] == [(0, 6), (6, 9)]
    assert [p.q_rows for p in plans] == [(0, 384), (384, 576)]
    assert [p.kv_rows for p in plans] == [(0, 128), (128, 192)]
    assert [p.intermediate for p in plans] == [(0, 768), (768, 1536)]
    assert [p.vocab for p in plans] == [(0, 24576), (24576, 49152)]
    assert all(p.layers == (0, 30) and p.has_embedding for p in plans)
    # KV bytes per block: 3 heads over the two ranks, as in one process.
    assert kv_block_bytes(config, layout, 16, "float32") == KVCacheSpec.of(config, 16, "float32").bytes_per_block
    # TP=3: one KV head per rank; TP=9: each KV head on 3 ranks, one query head each.
    assert [q_head_range(9, 3, 9, rank) for rank in range(3)] == [(0, 1), (1, 2), (2, 3)]
    assert [kv_head_range(3, 9, rank) for rank in range(9)] == [(0, 1)] * 3 + [(1, 2)] * 3 + [(2, 3)] * 3
    assert kv_block_bytes(config, ParallelLayout(tp_size=9), 16, "bfloat16") == \
        3 * KVCacheSpec.of(config, 16, "bfloat16").bytes_per_block


def test_default_model_pp_stages():
    assert [layer_range(30, 2, p) for p in range(2)] == [(0, 15), (15, 30)]
    assert [layer_range(30, 4, p) for p in range(4)] == [(0, 8), (8, 16), (16, 23), (23, 30)]
    config = make_config()
    layout = ParallelLayout(pp_size=2)
    first, last = (shard_plan(config, layout.rank_info(rank)) for rank in range(2))
    assert first.is_first_stage and first.has_embedding and not first.is_last_stage
    assert last.is_last_stage and last.has_embedding  # tied: the head reads the embedding rows
    untied = shard_plan(make_config(tie_word_embeddings=False), layout.rank_info(1))
    assert not untied.has_embedding
    assert kv_block_bytes(config, layout, 16, "float32") == KVCacheSpec.of(config, 16, "float32").bytes_per_block


@pytest.mark.parametrize("tp, pp, message", [
    (4, 1, r"--tensor-parallel-size 4 does not split .* 9 query heads and 3 KV heads.* in \[1, 2, 3, 9\]"),
    (6, 1, r"--tensor-parallel-size in \[1, 2, 3, 9\]"),
    (1, 31, r"--pipeline-parallel-size 31 exceeds the model's 30 layers.*<= 30"),
])
def test_impossible_layouts_are_refused_naming_the_flag_and_fix(tp, pp, message):
    with pytest.raises(ValueError, match=message):
        check_layout(make_config(), ParallelLayout(tp_size=tp, pp_size=pp))


def test_tp_larger_than_a_dimension_is_refused():
    config = make_config(num_heads=8, num_kv_heads=8, intermediate_size=4, vocab_size=64, hidden_size=64)
    with pytest.raises(ValueError, match="--tensor-parallel-size 8 exceeds the model's intermediate_size"):
        check_layout(config, ParallelLayout(tp_size=8))


def test_shard_checkpoint_renames_filters_and_cuts():
    """Tensor values encode (row, column), so the slice each rank got is visible in the numbers."""
    config = make_config(num_heads=6, num_kv_heads=3, head_dim=2, hidden_size=4, intermediate_size=5,
                         num_layers=3, vocab_size=7, tie_word_embeddings=False)

    def grid(rows, cols):
        return torch.arange(rows * cols, dtype=torch.float32).view(rows, cols)

    checkpoint = {"model.embed_tokens.weight": grid(7, 4), "lm_head.weight": grid(7, 4),
                  "model.norm.weight": torch.ones(4)}
    for layer in range(3):
        prefix = f"model.layers.{layer}."
        checkpoint.update({
            prefix + "input_layernorm.weight": torch.full((4,), float(layer)),
            prefix + "self_attn.q_proj.weight": grid(12, 4), prefix + "self_attn.q_proj.bias": torch.arange(12.),
            prefix + "self_attn.k_proj.weight": grid(6, 4), prefix + "self_attn.v_proj.weight": grid(6, 4),
            prefix + "self_attn.o_proj.weight": grid(4, 12),
            prefix + "mlp.gate_proj.weight": grid(5, 4), prefix + "mlp.up_proj.weight": grid(5, 4),
            prefix + "mlp.down_proj.weight": grid(4, 5)})
    layout = ParallelLayout(tp_size=2, pp_size=2)
    # Rank 3: tp_rank 1 of the last stage (layer 2): KV head 2, query heads 4..5, columns 3..4, vocab 4..6.
    got = dict(shard_checkpoint(shard_plan(config, layout.rank_info(3)), checkpoint.items()))
    assert sorted(got) == sorted(["lm_head.weight", "model.norm.weight"] + [
        f"model.layers.0.{name}" for name in ("input_layernorm.weight", "self_attn.q_proj.weight",
                                              "self_attn.q_proj.bias", "self_attn.k_proj.weight",
                                              "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                                              "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")])
    layer = "model.layers.0."
    assert torch.equal(got[layer + "input_layernorm.weight"], torch.full((4,), 2.0))  # global layer 2
    assert torch.equal(got[layer + "self_attn.q_proj.weight"], grid(12, 4)[8:12])
    assert torch.equal(got[layer + "self_attn.q_proj.bias"], torch.arange(8., 12.))
    assert torch.equal(got[layer + "self_attn.k_proj.weight"], grid(6, 4)[4:6])
    assert torch.equal(got[layer + "self_attn.o_proj.weight"], grid(4, 12)[:, 8:12])
    assert torch.equal(got[layer + "mlp.gate_proj.weight"], grid(5, 4)[3:5])
    assert torch.equal(got[layer + "mlp.down_proj.weight"], grid(4, 5)[:, 3:5])
    assert torch.equal(got["lm_head.weight"], grid(7, 4)[4:7])
    # Rank 0: first stage (layers 0, 1), no norm or head; embedding rows 0..3, KV heads 0..1.
    got = dict(shard_checkpoint(shard_plan(config, layout.rank_info(0)), checkpoint.items()))
    assert "lm_head.weight" not in got and "model.norm.weight" not in got
    assert {name.split(".")[2] for name in got if name.startswith("model.layers.")} == {"0", "1"}
    assert torch.equal(got["model.embed_tokens.weight"], grid(7, 4)[:4])
    assert torch.equal(got["model.layers.1.self_attn.v_proj.weight"], grid(6, 4)[:4])
    assert torch.equal(got["model.layers.1.self_attn.q_proj.weight"], grid(12, 4)[:8])
