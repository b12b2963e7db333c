"""The C++ decoder stack on quantized layers (GGUF blocks as stored, int8 per channel, GPTQ / AWQ, block-scaled fp8)
against the Python layer loop it stands in for: both call the same quantized kernels with the same activations,
so a step's hidden states, residual and every cache slot are equal bit for bit (decode, a mixed
step with padding, one token, and a step past the dense stack's row limit). A layer that mixes
block formats inside one fused linear (a small model's Q4_K_M file: Q5_0 q / k with a Q8_0 v) runs one kernel
call per format in both; a float tensor of the file beside quantized ones makes the stack decline, naming the
layer."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as T

from pagedcore.layers.decoder_stack import QUANT_STACK_MAX_ROWS
from pagedcore.loader import load_model
from pagedcore.ops.linear import max_rows
from pagedcore.ops.quant_repack import repackable

from ..models.paged_driver import PagedDriver
from ..models.test_decoder_stack import _STEPS, _stack_and_loop
from ..models.test_llama_parity import random_prompt
from ..models.tiny_models import build_hf_model
from ..loader import tiny_gguf
from ..models import tiny_models
from . import quant_models
from .gptq_awq_checkpoints import write_gptq_awq_folder

_PROMPT_LENS = {0: 5, 1: 17, 2: 40}  # sequence id -> prompt length (within a block, across edges)


def _block_model(tmp_path, kind, matrix_type, tensor_types=None):
    path = quant_models.write_block_gguf(tmp_path / "m.gguf", kind, matrix_type, tensor_types)
    return load_model(path, load_tokenizer=False).model


def _kquant_model(tmp_path, types=quant_models.KQUANT_UNIFORM_TYPES):
    path = quant_models.write_kquant_gguf(tmp_path / "k.gguf", types)
    return load_model(path, load_tokenizer=False).model


def _int8_model(tmp_path):
    folder = tmp_path / "hf"
    build_hf_model("llama").save_pretrained(folder)
    tiny_models.make_tokenizer().save_pretrained(folder)
    return load_model(str(folder), quantization="int8_per_channel", load_tokenizer=False).model


def _fp8_block_model(tmp_path):
    from .fp8_checkpoints import write_fp8_folder

    folder, _ = write_fp8_folder(tmp_path / "fp8", "ct-fp8-block", "llama")  # 32 x 64 scale blocks
    return load_model(folder, load_tokenizer=False).model


def _int4_model(tmp_path, method, **kwargs):
    folder, _ = write_gptq_awq_folder(tmp_path / method, method, **kwargs)
    return load_model(folder, load_tokenizer=False).model


MODELS = {
    "q4_1": lambda tmp: _block_model(tmp, "llama", T.Q4_1, {"output.weight": T.Q8_0}),
    "q4_0-tied": lambda tmp: _block_model(tmp, "llama_tied", T.Q4_0, {"token_embd.weight": T.Q8_0}),
    # a small model's Q4_K_M file: Q5_0 layers (rows not whole super-blocks), a Q5_1 table (lookups, tied head)
    "q5_0-tied-q5_1": lambda tmp: _block_model(tmp, "llama_tied", T.Q5_0, {"token_embd.weight": T.Q5_1}),
    # fused layers of two formats (as llama.cpp's Q4_K_M writes them): a qkv of Q5_0 q / k and a Q8_0 v, a gate_up
    # of a Q5_0 gate and a Q4_0 up (each part its own kernel call; the gate_up's SwiGLU after both)
    "mixed-parts": lambda tmp: _block_model(tmp, "llama", T.Q5_0, {"blk.0.attn_v.weight": T.Q8_0,
                                                                  "blk.1.ffn_up.weight": T.Q4_0}),
    "qwen2-q8_0-bias": lambda tmp: _block_model(tmp, "qwen2", T.Q8_0),
    "k-quants": _kquant_model,
    # Q3_K / IQ4_NL converted at load into Q6_K / Q8_0 (a qkv of both: two runs)
    "converted": lambda tmp: _kquant_model(tmp, quant_models.CONVERTED_TYPES),
    "int8_per_channel": _int8_model,
    # act-order GPTQ: every linear gathers its inputs (x[:, input_perm]) before the kernel, in both paths
    "gptq-act-order": lambda tmp: _int4_model(tmp, "gptq", group_size=32, sym=False, act_order=True),
    "awq-qwen2": lambda tmp: _int4_model(tmp, "awq", kind="qwen2", group_size=64),
    # block-scaled fp8 has only the x16 kernel: it repacks whatever PAGEDCORE_QUANT_REPACK says
    "fp8-block": _fp8_block_model,
}
ALWAYS_REPACKED = {"fp8-block"}
FORMATS = {"q4_1": ["q4_1"], "q4_0-tied": ["q4_0"], "q5_0-tied-q5_1": ["q5_0"], "qwen2-q8_0-bias": ["q8_0"],
           "mixed-parts": ["q5_0", "q8_0", "q4_0"], "converted": ["q8_0", "q6_k", "q4_k"],
           "k-quants": ["q4_k", "q5_k", "q6_k"], "int8_per_channel": ["int8_per_channel"],
           "gptq-act-order": ["q4_1"], "awq-qwen2": ["q4_1"], "fp8-block": ["fp8_e4m3"]}


@pytest.mark.parametrize("repack", ["repacked", "file_layout"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_quantized_stack_equals_the_layer_loop(tmp_path, monkeypatch, name, repack):
    if repack == "file_layout":  # the ggml-layout kernels (what CPUs without the x16 kernels run)
        monkeypatch.setenv("PAGEDCORE_QUANT_REPACK", "0")
    model = MODELS[name](tmp_path)
    assert model.decoder_stack_status.supported, model.decoder_stack_status.reason
    stack = model.model._decoder_stack()
    # On CPUs with the 16-row kernels the 32-weight formats run repacked (ops/quant_repack.py).
    repacked = repack == "repacked" or name in ALWAYS_REPACKED
    assert stack.formats == sorted((repackable(fmt, 64) if repacked else None) or fmt for fmt in FORMATS[name])
    assert stack.max_rows == QUANT_STACK_MAX_ROWS > max_rows(torch.float32)  # no GEMM hand-off to match
    driver = PagedDriver(model, seed=5)  # shuffled free list: scattered, out-of-order blocks
    for seq_id, length in _PROMPT_LENS.items():
        driver.step([(seq_id, random_prompt(length, seed=seq_id))])
    steps = dict(_STEPS)
    # More rows than the dense stack takes: a prefill chunk the quantized stack runs too.
    steps["long prefill"] = ([(4, random_prompt(max_rows(torch.float32) + 7, seed=11))], 0)
    for step, (chunks, num_padding) in steps.items():
        by_stack, by_loop = _stack_and_loop(model, driver, chunks, num_padding)
        for part, got, want in zip(("hidden", "residual", "kv_cache"), by_stack, by_loop):
            assert torch.equal(got, want), f"{name}, step {step!r}, {part}: max diff " \
                                           f"{(got - want).abs().max().item()}"


def test_the_engine_path_uses_the_stack_and_matches_the_loop(tmp_path, monkeypatch):
    """Whole greedy runs (chunked prefill, then decode) through the model's forward: the stack and
    PAGEDCORE_DECODER_STACK=0 give the same tokens and logits, bit for bit."""
    model = MODELS["q4_1"](tmp_path)
    prompt = random_prompt(30, seed=3)
    tokens, logits = PagedDriver(model, seed=1).greedy(0, prompt, 8, prefill_split=12)
    monkeypatch.setenv("PAGEDCORE_DECODER_STACK", "0")
    model.model.refresh_decoder_stack()
    assert not model.decoder_stack_status.supported
    loop_tokens, loop_logits = PagedDriver(model, seed=1).greedy(0, prompt, 8, prefill_split=12)
    assert tokens == loop_tokens and torch.equal(logits, loop_logits)


@pytest.mark.parametrize("tensor_types, reason", [
    # A float shard beside quantized ones in one fused layer (a whole float layer is a dense one the stack runs:
    # tests/quantization/test_gguf_float_layers.py; two block formats run: "mixed-parts" above).
    ({"blk.2.attn_v.weight": T.F16}, "layer 2 self_attn.qkv_proj has a 'float32' part"),
    ({"blk.1.ffn_up.weight": T.F32}, "layer 1 mlp.gate_up_proj has a 'float32' part"),
])
def test_a_float_part_beside_blocks_makes_the_stack_decline(tmp_path, tensor_types, reason):
    model = _block_model(tmp_path, "llama", T.Q4_1, tensor_types)
    status = model.decoder_stack_status
    assert not status.supported and reason in status.reason, status.reason
