"""A repacked dense layer holds its weight bytes once (PAGEDCORE_DENSE_REPACK=1): after loading a tiny
model every linear's weight is an X16Weight (ops/dense_repack.py) whose only bytes are the x16
layout, the checkpoint-layout tensors are freed, the resident bytes are counted once, and whatever
needs W again gets it: a reload (whole or one shard), .data = t, a move to another device."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pagedcore.layers.linear import DenseLinearMethod, Linear, current_x16_weight, restore_checkpoint_layout
from pagedcore.loader import hf_loader, load_model
from pagedcore.loader.weight_memory import weight_bytes_by_format
from pagedcore.ops.dense_repack import X16Weight, pack_x16

from .paged_driver import PagedDriver
from .test_llama_parity import random_prompt


def _load(folder, dtype, repack: str, monkeypatch):
    monkeypatch.setenv("PAGEDCORE_DENSE_REPACK", repack)
    return load_model(folder, dtype=dtype, load_tokenizer=False)


def _linears(model):
    return [m for m in model.modules() if isinstance(m, Linear)]


def _greedy(model, prompt):
    """Logits of a prefill and three decode steps (the stack and the layer loop both run)."""
    driver = PagedDriver(model, seed=6)
    logits = [driver.step([(0, prompt)])]
    for _ in range(3):
        logits.append(driver.step([(0, [int(logits[-1][-1].argmax())])]))
    return torch.cat(logits)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kind", ["llama", "llama_tied"])
def test_the_checkpoint_copy_is_freed_and_the_bytes_counted_once(tiny_model_factory, monkeypatch, kind, dtype):
    _, folder = tiny_model_factory(kind)
    replaced = []  # (weakref to the checkpoint-layout parameter, its data_ptr) of every repacked layer
    process = DenseLinearMethod.process_weights_after_loading

    def spy(self, layer):
        before = layer.weight
        process(self, layer)
        if layer.weight is not before:
            replaced.append((weakref.ref(before), before.data_ptr()))

    monkeypatch.setattr(DenseLinearMethod, "process_weights_after_loading", spy)
    loaded = _load(folder, dtype, "1", monkeypatch)
    gc.collect()
    linears = _linears(loaded.model)
    assert linears and all(type(m.weight) is X16Weight and current_x16_weight(m) is m.weight.packed
                           for m in linears)
    assert len(replaced) == len(linears)
    assert all(ref() is None for ref, _ in replaced)  # the checkpoint-layout parameters are gone...
    freed_ptrs = {ptr for _, ptr in replaced}
    live = [t for t in gc.get_objects() if isinstance(t, torch.Tensor) and type(t) is not X16Weight
            and t.device.type == "cpu"]
    assert not [t.shape for t in live if t.untyped_storage().data_ptr() in freed_ptrs]  # ...and their memory
    if kind == "llama_tied":  # the head is the embedding table: repacked for it, held once too
        assert loaded.model.lm_head is None
        assert type(loaded.model.model.embed_tokens.weight) is X16Weight
    else:
        assert type(loaded.model.lm_head.weight) is X16Weight

    monkeypatch.setattr(DenseLinearMethod, "process_weights_after_loading", process)
    off = _load(folder, dtype, "0", monkeypatch)
    if kind == "llama_tied":
        table, plain_table = loaded.model.model.embed_tokens.weight, off.model.model.embed_tokens.weight
        assert type(plain_table) is nn.Parameter and torch.equal(table.packed, pack_x16(plain_table))
    for m, plain in zip(linears, _linears(off.model), strict=True):
        assert type(plain.weight) is nn.Parameter
        assert torch.equal(m.weight.packed, pack_x16(plain.weight))  # the bytes the x16 kernel read before
        assert torch.equal(m.weight, plain.weight) and m.weight.nbytes == m.weight.packed.nbytes
    # Resident bytes: once, the same as without the repack (the log's "... MB of weights").
    assert loaded.weight_bytes == off.weight_bytes == weight_bytes_by_format(loaded.model)
    assert sum(loaded.weight_bytes.values()) == sum(p.nbytes for p in loaded.model.parameters())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_reload_repacks_and_the_logits_stay_bit_identical(tiny_model_factory, monkeypatch, dtype):
    _, folder = tiny_model_factory("llama")
    model = _load(folder, dtype, "1", monkeypatch).model
    prompt = random_prompt(19, seed=4)
    before = _greedy(model, prompt)
    packed_before = [m.weight.packed.clone() for m in _linears(model)]
    model.load_weights(hf_loader.weights_from_safetensors(hf_loader.safetensors_files(folder)))
    assert all(type(m.weight) is X16Weight for m in _linears(model))
    assert all(torch.equal(m.weight.packed, p) for m, p in zip(_linears(model), packed_before, strict=True))
    assert model.decoder_stack_status.supported
    assert torch.equal(_greedy(model, prompt), before)
    # Back to the checkpoint layout: W as it was (the kernels differ: close, not equal).
    for m in _linears(model):
        restore_checkpoint_layout(m)
    assert all(type(m.weight) is nn.Parameter and m.weight.dim() == 2 for m in _linears(model))
    atol = 1e-4 if dtype == "float32" else 0.1
    torch.testing.assert_close(_greedy(model, prompt)[: len(prompt)], before[: len(prompt)], atol=atol, rtol=0.02)


def _reference(x, weight, bias=None):
    return F.linear(x.double(), weight.double(), None if bias is None else bias.double())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_shard_reload_writes_w_in_the_checkpoint_layout(tiny_model_factory, monkeypatch, dtype):
    _, folder = tiny_model_factory("llama")
    model = _load(folder, dtype, "1", monkeypatch).model
    qkv = model.model.layers[1].self_attn.qkv_proj
    W = qkv.weight.clone()  # [out, in], unpacked from the x16 bytes
    first, rows = qkv.shard_rows["k"]
    new_k = torch.randn(rows, qkv.in_features, generator=torch.Generator().manual_seed(3))
    qkv.load_shard("k", "weight", new_k, "model.layers.1.self_attn.k_proj.weight")
    assert type(qkv.weight) is nn.Parameter and current_x16_weight(qkv) is None
    W[first:first + rows] = new_k.to(W.dtype)
    assert torch.equal(qkv.weight, W)  # the other shards' rows kept
    x = torch.randn(3, qkv.in_features, generator=torch.Generator().manual_seed(4)).to(W.dtype)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == "float32" else dict(atol=0.1, rtol=0.02)
    torch.testing.assert_close(qkv(x).double(), _reference(x, W), **tol)
    DenseLinearMethod.process_weights_after_loading(qkv.method, qkv)  # as load_weights ends
    assert type(qkv.weight) is X16Weight and torch.equal(qkv.weight, W)
    torch.testing.assert_close(qkv(x).double(), _reference(x, W), **tol)


def test_assigning_data_runs_the_new_weight(tiny_model_factory, monkeypatch):
    _, folder = tiny_model_factory("llama")
    model = _load(folder, "float32", "1", monkeypatch).model
    down = model.model.layers[0].mlp.down_proj
    W2 = torch.randn(down.out_features, down.in_features, generator=torch.Generator().manual_seed(5))
    x = torch.randn(4, down.in_features, generator=torch.Generator().manual_seed(6))
    down.weight.data = W2
    torch.testing.assert_close(down(x).double(), _reference(x, W2), atol=1e-4, rtol=1e-4)
    assert type(down.weight) is nn.Parameter and down.weight.data_ptr() == W2.data_ptr()  # swapped in


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_device_move_gets_w_in_the_checkpoint_layout(tiny_model_factory, monkeypatch, dtype):
    """A GPU move as this CPU-only suite can make one: to the meta device (shapes, no values). The
    values' path (unpack, then copy) is what .to(device) runs on every X16Weight (test_x16_weight)."""
    _, folder = tiny_model_factory("llama")
    model = _load(folder, dtype, "1", monkeypatch).model
    shapes = {name: (m.out_features, m.in_features) for name, m in model.named_modules() if isinstance(m, Linear)}
    model.to("meta")
    for name, m in model.named_modules():
        if isinstance(m, Linear):
            assert m.weight.device.type == "meta" and tuple(m.weight.shape) == shapes[name]
            assert current_x16_weight(m) is None
    assert not model.decoder_stack_status.supported  # the stack reads CPU tensors only
    o_proj = model.model.layers[0].self_attn.o_proj
    y = o_proj(torch.empty(5, o_proj.in_features, dtype=o_proj.weight.dtype, device="meta"))
    assert y.device.type == "meta" and y.shape == (5, o_proj.out_features)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_calls_the_kernel_does_not_take_run_on_w_unpacked(tiny_model_factory, monkeypatch, dtype):
    """x of 3 dims or of no rows: the x16 kernel takes neither, so the layer multiplies by W unpacked
    for the call (the checkpoint layout's copy no longer exists to hand to the library GEMM)."""
    _, folder = tiny_model_factory("llama")
    model = _load(folder, dtype, "1", monkeypatch).model
    mlp = model.model.layers[2].mlp
    gate_up = mlp.gate_up_proj
    W = gate_up.weight.clone()  # [2 * intermediate, hidden]
    x = torch.randn(2, 3, gate_up.in_features, generator=torch.Generator().manual_seed(7)).to(W.dtype)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == "float32" else dict(atol=0.1, rtol=0.02)
    torch.testing.assert_close(gate_up(x).double(), _reference(x, W), **tol)
    half = W.shape[0] // 2
    want = _reference(x, W)
    want = F.silu(want[..., :half]) * want[..., half:]
    torch.testing.assert_close(gate_up.forward_silu_mul(x).double(), want, **tol)
    assert gate_up(x[0, :0]).shape == (0, gate_up.out_features)
    assert type(gate_up.weight) is X16Weight  # still held packed


def test_a_weight_shared_with_another_module_stays_whole_for_it(monkeypatch):
    """The repack replaces the layer's parameter and never writes the old one: a module that shares
    it (as a tied table would) keeps reading W, and the old bytes live on for it alone."""
    monkeypatch.setenv("PAGEDCORE_DENSE_REPACK", "1")
    method = DenseLinearMethod("bfloat16", torch.bfloat16)
    head = Linear(64, 96, bias=False, method=method)
    W = torch.randn(96, 64, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    head.load_weight("weight", W, "lm_head.weight")
    table = nn.Embedding(96, 64)
    table.weight = head.weight  # the same parameter, as tied embeddings share one
    shared = head.weight
    method.process_weights_after_loading(head)
    assert type(head.weight) is X16Weight and table.weight is shared and torch.equal(table.weight, W)
    ids = torch.tensor([3, 95, 0])
    assert torch.equal(table(ids), W[ids])
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    torch.testing.assert_close(head(x).double(), _reference(x, W), atol=0.1, rtol=0.02)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_tied_table_repacked_for_the_head_looks_up_exact_rows(tiny_model_factory, monkeypatch, dtype):
    """The tied table held as x16: lookups decode its rows exactly (the C++ decoder), the head runs
    the x16 kernel (close to the checkpoint-layout kernel's logits), and a reload of the table puts
    it back in the checkpoint layout until processing repacks it again."""
    _, folder = tiny_model_factory("llama_tied")
    model = _load(folder, dtype, "1", monkeypatch).model
    plain = _load(folder, dtype, "0", monkeypatch).model
    emb, plain_emb = model.model.embed_tokens, plain.model.embed_tokens
    assert type(emb.weight) is X16Weight and emb._logits_kernel.x16 and type(plain_emb.weight) is nn.Parameter
    ids = torch.tensor([0, 5, emb.vocab_size - 1, 5, 17])
    assert torch.equal(emb(ids), plain_emb(ids)) and torch.equal(emb(ids), plain_emb.weight[ids])
    prompt = random_prompt(13, seed=2)
    atol = 1e-4 if dtype == "float32" else 0.1
    torch.testing.assert_close(_greedy(model, prompt)[: len(prompt)], _greedy(plain, prompt)[: len(prompt)],
                               atol=atol, rtol=0.02)
    W = plain_emb.weight.detach().clone()
    emb.load_weight("weight", W.flip(0), "model.embed_tokens.weight")  # a reload: checkpoint layout again
    assert type(emb.weight) is nn.Parameter and not emb._logits_kernel.x16
    assert torch.equal(emb(ids), W.flip(0)[ids])
    monkeypatch.setenv("PAGEDCORE_DENSE_REPACK", "1")  # (the second _load left it "0")
    emb.process_weights_after_loading()
    assert type(emb.weight) is X16Weight and torch.equal(emb(ids), W.flip(0)[ids])
    x = torch.randn(3, emb.hidden_size, generator=torch.Generator().manual_seed(1)).to(W.dtype)
    torch.testing.assert_close(emb.logits(x).double(), _reference(x, W.flip(0)), atol=atol, rtol=0.02)
