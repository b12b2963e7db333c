"""Dense weights repacked at load into the x16 layouts (PAGEDCORE_DENSE_REPACK, ops/dense_repack.py):
the layers hold W only as the repack (X16Weight), the C++ decoder stack reads the same repack and equals the
Python layer loop bit for bit (decode, mixed and a 200-row step, which the stack now takes), and
switching it off restores the checkpoint-layout kernels."""

from __future__ import annotations

import pytest
import torch

from pagedcore.layers.linear import Linear, current_x16_weight
from pagedcore.loader import load_model
from pagedcore.ops.dense_repack import X16_MAX_ROWS, unpack_x16

from .paged_driver import PagedDriver
from .test_decoder_stack import _STEPS, _assert_same, _prefilled, _stack_and_loop
from .test_llama_parity import random_prompt


def _linears(model):
    return [m for m in model.model.layers.modules() if isinstance(m, Linear)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_repacked_stack_equals_the_layer_loop(tiny_model_factory, monkeypatch, kind, dtype):
    monkeypatch.setenv("PAGEDCORE_DENSE_REPACK", "1")
    _, folder = tiny_model_factory(kind)
    model, driver = _prefilled(folder, dtype, seed=5)
    linears = _linears(model)
    assert linears and all(current_x16_weight(m) is not None for m in linears)
    for m in linears:  # the repack holds W exactly
        assert torch.equal(unpack_x16(current_x16_weight(m)), m.weight)
    stack = model.model._decoder_stack()
    assert stack is not None, model.decoder_stack_status.reason
    assert stack.formats == [{"float32": "f32x16", "bfloat16": "bf16x16"}[dtype]]
    assert stack.max_rows == X16_MAX_ROWS  # every step: the layers never call a library GEMM
    steps = dict(_STEPS)
    steps["large"] = ([(5, random_prompt(200, seed=8))], 0)  # past the checkpoint layout's 128 rows
    for name, (chunks, num_padding) in steps.items():
        by_stack, by_loop = _stack_and_loop(model, driver, chunks, num_padding)
        try:
            _assert_same(by_stack, by_loop, dtype, model.config.qk_norm)
        except AssertionError as error:
            raise AssertionError(f"{kind} {dtype}, step {name!r}: {error}") from None


def test_switch_off_keeps_the_checkpoint_layout(tiny_model_factory, monkeypatch):
    _, folder = tiny_model_factory("llama")
    prompt = random_prompt(21, seed=7)
    logits = {}
    for env in ("0", "1"):
        monkeypatch.setenv("PAGEDCORE_DENSE_REPACK", env)
        model = load_model(folder, dtype="float32", load_tokenizer=False).model
        assert all((current_x16_weight(m) is not None) == (env == "1") for m in _linears(model))
        logits[env] = PagedDriver(model, seed=6).step([(0, prompt)])
    # Another summation order: close, not equal.
    torch.testing.assert_close(logits["1"], logits["0"], atol=1e-4, rtol=1e-4)


def test_shapes_the_layout_cannot_hold_stay_dense_and_the_stack_keeps_its_threshold(tiny_model_factory, monkeypatch):
    monkeypatch.setenv("PAGEDCORE_DENSE_REPACK", "1")
    _, folder = tiny_model_factory("qwen2_uneven")  # intermediate 201: gate_up 402 rows, down K 201
    model = load_model(folder, dtype="bfloat16", load_tokenizer=False).model
    layer = model.model.layers[0]
    assert current_x16_weight(layer.mlp.gate_up_proj) is None  # 201 gate rows: not whole groups of 16
    assert current_x16_weight(layer.mlp.down_proj) is None  # bf16 K = 201 is odd
    assert current_x16_weight(layer.self_attn.o_proj) is not None  # 96 x 96
    stack = model.model._decoder_stack()
    if stack is not None:  # mixed formats: dense layers still hand big steps to a library GEMM
        assert stack.max_rows < X16_MAX_ROWS
