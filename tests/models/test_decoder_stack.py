"""The C++ decoder stack against the Python layer loop it stands in for: one step on the same inputs
and the same paged KV cache state (random, non-contiguous block tables), decode-only and small mixed
steps: hidden states, residual and every cache slot bit for bit, in fp32 and bf16, except with
Qwen3's q/k norm (QK_NORM_RTOL). And the capability check that keeps the stack off layers it would
not run as their forward does."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from pagedcore.layers.decoder_stack_support import decoder_stack_support
from pagedcore.layers.linear import DenseLinearMethod, Linear
from pagedcore.loader import load_model

from .paged_driver import PagedDriver
from .test_llama_parity import random_prompt
from .tiny_models import TINY_KINDS

# Largest difference allowed, relative to the largest magnitude of the tensor, where the model has
# q/k norm. The loop normalises each head with torch's F.rms_norm on a 3-D view, the stack with the
# fused kernel the 2-D norms use; they sum in a different order (one op, measured: 4.8e-7 apart).
# Measured on the tiny Qwen3 after three layers: fp32 1.3e-6 (mixed step), bf16 0 (the fp32 gap
# is below bf16 rounding). Bounds: fp32 1e-5; bf16 1/128 (a rounding flipped the other way is 1/256).
# Every other kind, fp32 and bf16: measured 0, asserted equal.
QK_NORM_RTOL = {"float32": 1e-5, "bfloat16": 1 / 128}

# Sequence id -> prompt length: within one block, across a block edge, several blocks.
_PROMPT_LENS = {0: 5, 1: 17, 2: 40}


def _prefilled(folder: str, dtype: str, seed: int) -> tuple[nn.Module, PagedDriver]:
    model = load_model(folder, dtype=dtype, load_tokenizer=False).model
    driver = PagedDriver(model, seed=seed)  # shuffled free list: scattered, out-of-order blocks
    for seq_id, length in _PROMPT_LENS.items():
        driver.step([(seq_id, random_prompt(length, seed=seq_id))])
    return model, driver


def _stack_and_loop(model, driver: PagedDriver, chunks, num_padding: int = 0):
    """One step run twice from the same cache state: by the stack on a copy of the cache, then by the
    layer loop on the driver's cache. Returns ((hidden, residual, cache) of the stack, of the loop)."""
    input_ids, positions, metadata = driver.prepare(chunks, num_padding)
    inner = model.model
    stack = inner._decoder_stack()
    assert stack is not None, model.decoder_stack_status.reason
    with torch.inference_mode():
        hidden = inner.embed_tokens(input_ids)  # [num_tokens, hidden_size]
        cos_sin = inner.rotary_emb(positions)
        assert stack.takes(hidden, driver.kv_cache)
        stack_cache = driver.kv_cache.clone()
        by_stack = (*stack(hidden.clone(), cos_sin, stack_cache, metadata), stack_cache)
        by_loop = (*inner.run_layers(hidden.clone(), cos_sin, driver.kv_cache, metadata), driver.kv_cache)
    return by_stack, by_loop


def _assert_same(by_stack, by_loop, dtype: str, qk_norm: bool) -> None:
    for name, got, want in zip(("hidden", "residual", "kv_cache"), by_stack, by_loop):
        diff = (got.float() - want.float()).abs().max().item()
        if qk_norm:
            bound = QK_NORM_RTOL[dtype] * want.float().abs().max().item()
            assert diff <= bound, f"{name}: max diff {diff} > {bound}"
        else:
            assert torch.equal(got, want), f"{name}: max diff {diff}"


# A decode step of every sequence; a mixed step: two decodes, a new prompt, a prompt's next chunk,
# padding rows; a one-token step.
_STEPS = {
    "decode": ([(0, [7]), (1, [8]), (2, [9])], 0),
    "mixed": ([(1, [11]), (3, random_prompt(9, seed=3)), (0, random_prompt(4, seed=4)), (2, [12])], 3),
    "single": ([(2, [13])], 0),
}


def assert_stack_equals_loop(model, label: str) -> None:
    """Three prompts prefilled, then each of _STEPS run by the stack and by the layer loop from the same cache:
    hidden, residual and cache equal bit for bit (a model whose stack runs every linear as the loop does)."""
    driver = PagedDriver(model, seed=5)  # shuffled free list: scattered, out-of-order blocks
    for seq_id, length in {0: 5, 1: 17, 2: 40}.items():
        driver.step([(seq_id, random_prompt(length, seed=seq_id))])
    for step, (chunks, num_padding) in _STEPS.items():
        by_stack, by_loop = _stack_and_loop(model, driver, chunks, num_padding)
        for part, got, want in zip(("hidden", "residual", "kv_cache"), by_stack, by_loop):
            assert torch.equal(got, want), f"{label}, step {step!r}, {part}"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kind", sorted(TINY_KINDS))
def test_stack_equals_the_layer_loop(tiny_model_factory, kind, dtype):
    _, folder = tiny_model_factory(kind)
    model, driver = _prefilled(folder, dtype, seed=5)
    assert model.decoder_stack_status.supported, model.decoder_stack_status.reason
    for name, (chunks, num_padding) in _STEPS.items():
        by_stack, by_loop = _stack_and_loop(model, driver, chunks, num_padding)
        try:
            _assert_same(by_stack, by_loop, dtype, model.config.qk_norm)
        except AssertionError as error:
            raise AssertionError(f"{kind} {dtype}, step {name!r}: {error}") from None


class _OtherFormat(DenseLinearMethod):
    """Dense arithmetic under a name the stack does not know: stands in for a quantised format."""


def _tiny(tiny_model_factory, kind: str = "llama"):
    _, folder = tiny_model_factory(kind)
    return load_model(folder, load_tokenizer=False).model


def test_an_unknown_weight_format_makes_the_stack_decline(tiny_model_factory, caplog):
    model = _tiny(tiny_model_factory)
    driver = PagedDriver(model, seed=6)
    prompt = random_prompt(21, seed=7)
    expected = driver.step([(0, prompt)])  # by the stack

    model.model.layers[1].self_attn.o_proj.method = _OtherFormat("test_packed", torch.float32)
    with caplog.at_level(logging.INFO, logger="pagedcore.models.llama"):
        model.model.refresh_decoder_stack()
        status = model.decoder_stack_status
        assert not status.supported
        assert "layer 1 self_attn.o_proj has weight format 'test_packed'" in status.reason
        assert model.model._decoder_stack() is None
        again = PagedDriver(model, seed=6).step([(0, prompt)])  # the layer loop, through the new method
        PagedDriver(model, seed=6).step([(0, prompt)])
    assert torch.equal(again, expected)
    assert [r.getMessage() for r in caplog.records].count(
        f"small steps run the Python layer loop, not the C++ decoder stack: {status.reason}") == 1


def _with_adapter(model):
    layer = model.model.layers[2]
    layer.mlp.adapter = nn.Linear(4, 4)  # a module the stack has never heard of


def _with_o_proj_bias(model):
    attn = model.model.layers[0].self_attn
    attn.o_proj = Linear(attn.o_proj.in_features, attn.o_proj.out_features, bias=True, method=attn.o_proj.method)


def _with_linear_subclass(model):
    class LoRALinear(Linear):
        pass
    mlp = model.model.layers[1].mlp
    mlp.down_proj.__class__ = LoRALinear


@pytest.mark.parametrize(("change", "reason"), [
    (_with_adapter, "layer 2 has mlp.adapter (Linear), which the stack does not run"),
    (_with_o_proj_bias, "layer 0 has ['self_attn.o_proj.bias'], which the stack does not read"),
    (_with_linear_subclass, "layer 1 has mlp.down_proj (LoRALinear), which the stack does not run"),
])
def test_a_feature_the_stack_lacks_makes_it_decline(tiny_model_factory, change, reason):
    model = _tiny(tiny_model_factory)
    assert decoder_stack_support(model.config, model.model.layers).supported
    change(model)
    status = decoder_stack_support(model.config, model.model.layers)
    assert not status.supported and reason in status.reason


def test_the_switch_and_the_device_are_rules_too(tiny_model_factory, monkeypatch):
    model = _tiny(tiny_model_factory, "qwen3")
    monkeypatch.setenv("PAGEDCORE_DECODER_STACK", "0")
    assert decoder_stack_support(model.config, model.model.layers).reason == \
        "turned off by PAGEDCORE_DECODER_STACK=0"
    monkeypatch.delenv("PAGEDCORE_DECODER_STACK")
    model.model.layers[0].mlp.down_proj.weight.data = model.model.layers[0].mlp.down_proj.weight.data.t()
    status = decoder_stack_support(model.config, model.model.layers)
    assert not status.supported and "layer 0 down" in status.reason and "contiguous: False" in status.reason
