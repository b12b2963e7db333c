"""Tiny GGUF models served as stored (every block format, layers mixing formats, a blocked tied
embedding), held to the float64 oracle of the same arithmetic (reference_kernel.py) two ways:
every kernel call of a whole run (chunked prefill, then decode) against the oracle on the very
activations it sees (tight), and the greedy tokens of a run on the oracle alone (equal)."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as T

from pagedcore.layers.linear import LINEAR_METHODS
from pagedcore.layers.linear_quant import QuantLinearMethod
from pagedcore.loader import load_model
from pagedcore.ops.quant_repack import repackable

from ..models.paged_driver import PagedDriver
from . import quant_models
from .reference_kernel import CheckedKernels, use_reference_kernels

PROMPT = list(range(5, 40))
NUM_GENERATED = 8
# One kernel call against the oracle on the same input: fp32 sums against fp64 (measured <= 1e-6).
CALL_RTOL = 1e-5
# Whole runs: activations are quantized to int8, a step function, so a last-bit difference upstream
# may move one activation by a quantum and the runs drift apart slightly (measured up to 1.5% of the
# largest logit on these random models), while the greedy tokens stay the same.
RUN_RTOL = 0.05
NEAR_TIE = 0.01  # of the largest logit


def run(path, prefill_split=None):
    model = load_model(path, load_tokenizer=False).model
    return PagedDriver(model, seed=1).greedy(0, PROMPT, NUM_GENERATED, prefill_split=prefill_split)


def assert_same_as_oracle(path, monkeypatch, formats: set[str]):
    checks = CheckedKernels(monkeypatch)
    tokens, logits = run(path, prefill_split=12)  # the kernels: prefill in two chunks, then decode
    assert set(checks.calls) == formats and all(error < CALL_RTOL for error in checks.worst.values()), checks.worst
    use_reference_kernels(monkeypatch)
    ref_tokens, ref_logits = run(path)
    assert_same_greedy(tokens, logits, ref_tokens, ref_logits)


def assert_same_greedy(tokens, logits, ref_tokens, ref_logits):
    """Equal greedy tokens and close logits, up to a legitimate near tie (vLLM's rule for greedy
    comparisons): where the two first differ, each side's token is the other's runner-up within
    NEAR_TIE of its top logit, and the steps before match. Seen once: kernel 5.6750 vs 5.6747, the
    oracle 5.6802 vs 5.6534 for the same two tokens of a random tiny model."""
    steps = next((i for i, (a, b) in enumerate(zip(tokens, ref_tokens)) if a != b), len(tokens))
    scale = ref_logits.abs().max()
    assert (logits[:steps + 1] - ref_logits[:steps + 1]).abs().max() < RUN_RTOL * scale
    if steps < len(tokens):
        ours, theirs = logits[steps], ref_logits[steps]
        assert theirs.max() - theirs[tokens[steps]] < NEAR_TIE * scale, (steps, tokens, ref_tokens)
        assert ours.max() - ours[ref_tokens[steps]] < NEAR_TIE * scale, (steps, tokens, ref_tokens)


@pytest.mark.parametrize("kind, matrix_type, tensor_types, formats", [
    ("llama", T.Q4_1, {"output.weight": T.Q8_0}, {"q4_1", "q8_0"}),  # the default model's formats, untied
    ("llama_tied", T.Q4_0, {"token_embd.weight": T.Q8_0}, {"q4_0", "q8_0"}),  # tied head: q8_0 on the table
    ("qwen2", T.Q8_0, None, {"q8_0"}),  # q/k/v biases per part
    ("llama", T.Q4_1, {"blk.0.attn_v.weight": T.Q8_0, "blk.1.ffn_up.weight": T.Q4_0,
                       "blk.2.attn_output.weight": T.F16}, {"q4_1", "q8_0", "q4_0"}),  # mixed shards, a float part
    # A small model's Q4_K_M / Q5_K_M file: rows not whole 256-weight super-blocks fall back to Q5_0 / Q5_1
    ("llama", T.Q5_0, {"output.weight": T.Q8_0, "blk.0.attn_v.weight": T.Q5_1, "blk.1.ffn_up.weight": T.Q5_1},
     {"q5_0", "q5_1", "q8_0"}),
    ("llama_tied", T.Q5_1, {"token_embd.weight": T.Q5_0}, {"q5_1", "q5_0"}),  # a Q5_0 table: lookups, tied head
], ids=["q4_1", "q4_0-tied-q8_0", "qwen2-q8_0", "mixed", "q5_0-mixed-q5_1", "q5_1-tied-q5_0"])
def test_block_formats_equal_the_oracle(tmp_path, monkeypatch, kind, matrix_type, tensor_types, formats):
    path = quant_models.write_block_gguf(tmp_path / "m.gguf", kind, matrix_type, tensor_types)
    assert_same_as_oracle(path, monkeypatch, formats)


def test_k_quants_and_mixed_layers_equal_the_oracle(tmp_path, monkeypatch):
    path = quant_models.write_kquant_gguf(tmp_path / "k.gguf")
    model = load_model(path, load_tokenizer=False).model
    layers = model.model.layers
    linears = {"qkv0": layers[0].self_attn.qkv_proj,
               "gate_up0": layers[0].mlp.gate_up_proj, "down0": layers[0].mlp.down_proj,
               "qkv1": layers[1].self_attn.qkv_proj, "gate_up1": layers[1].mlp.gate_up_proj, "head": model.lm_head}
    file_formats = {name: [p.format.removesuffix("x16") for p in linear.quant_parts] for name, linear in linears.items()}
    assert file_formats == {"qkv0": ["q4_k", "q6_k"], "gate_up0": ["q4_k"], "down0": ["q6_k"],
                            "qkv1": ["q5_k"], "gate_up1": ["q5_k", "q4_k"], "head": ["q6_k"]}
    o0 = layers[0].self_attn.o_proj  # the file's F32 matrix: a dense fp32 layer (the stack's kernels, not torch)
    assert o0.method is LINEAR_METHODS["float32"] and not hasattr(o0, "quant_parts")
    # Parts of whole 16-row groups run repacked (q4_kx16, ...) where the CPU has the x16 kernels.
    for name, linear in linears.items():
        assert linear.method.formats(linear) == [repackable(fmt, p.num_rows) or fmt
                                                 for fmt, p in zip(file_formats[name], linear.quant_parts)], name
    embed = model.model.embed_tokens
    assert embed.block_format == (repackable("q4_k", embed.vocab_size) or "q4_k")
    assert isinstance(layers[0].self_attn.qkv_proj.method, QuantLinearMethod)
    assert_same_as_oracle(path, monkeypatch, {"q4_k", "q5_k", "q6_k"})


def test_converted_types_equal_the_oracle(tmp_path, monkeypatch):
    """Q3_K and IQ4_NL blocks (a small model's Q2_K / IQ4 files) run as the Q6_K / Q8_0 blocks they convert into
    exactly (loader/gguf_held_as.py): every kernel call against the oracle, greedy = the oracle; the table too."""
    path = quant_models.write_kquant_gguf(tmp_path / "c.gguf", quant_models.CONVERTED_TYPES)
    model = load_model(path, load_tokenizer=False).model
    qkv0 = model.model.layers[0].self_attn.qkv_proj
    assert [p.format.removesuffix("x16") for p in qkv0.quant_parts] == ["q8_0", "q6_k"]
    assert model.model.embed_tokens.block_format.removesuffix("x16") == "q8_0"
    assert model.decoder_stack_status.supported, model.decoder_stack_status.reason
    assert_same_as_oracle(path, monkeypatch, {"q8_0", "q6_k", "q4_k"})


def test_blocks_stay_blocks_and_the_stack_runs_them(tmp_path):
    """Served as stored: no float copy of a quantized tensor, fp32 activations, and the C++
    decoder stack runs the blocks as they are (test_quant_stack.py holds it to the layer loop)."""
    path = quant_models.write_block_gguf(tmp_path / "m.gguf", "llama_tied", T.Q4_1, {"token_embd.weight": T.Q8_0})
    loaded = load_model(path, load_tokenizer=False)
    model = loaded.model
    assert loaded.weight_format == "gguf" and loaded.config.dtype == "float32"
    assert model.model.embed_tokens.weight.dtype == torch.uint8
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert qkv.weight.dtype == torch.uint8 and qkv.weight.shape == (qkv.out_features, qkv.in_features // 32 * 20)
    assert qkv.method.formats(qkv) == [repackable("q4_1", qkv.out_features) or "q4_1"]  # same bytes either way
    assert set(loaded.weight_bytes) == {"q4_1", "q8_0", "float32"}
    assert model.decoder_stack_status.supported, model.decoder_stack_status.reason
    assert model.model._decoder_stack().formats == [repackable("q4_1", qkv.out_features) or "q4_1"]
