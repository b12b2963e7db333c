"""GPTQ and AWQ checkpoints (loader/gptq_awq_checkpoint.py) run on the block kernels, kept quantized: the
blocks a layer becomes equal the checkpoint's own formula (exactly for Q4_0 and Q8_0, within fp16's
rounding of the minimum for Q4_1), whole runs equal the float64 oracle of the same arithmetic, the flags
follow vLLM, and what the kernels cannot run is refused with the fix."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf import quants as gguf_quants
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedcore import LLM, SamplingParams
from pagedcore.config import quantization_error
from pagedcore.loader import ModelLoadError, load_model
from pagedcore.loader.gptq_awq_checkpoint import GptqAwqScheme, gptq_awq_weight
from pagedcore.loader.integer_weight import GroupedIntWeight
from pagedcore.loader.quantization import prequantized_scheme
from pagedcore.ops.quant_repack import repackable

from ..models import tiny_models
from ..models.paged_driver import PagedDriver
from .gptq_awq_checkpoints import (dequantized, pack_awq, pack_gptq, quantize_act_order, quantize_groups,
                               write_gptq_awq_folder)
from .test_quantized_models import PROMPT, assert_same_as_oracle

GPTQ = GptqAwqScheme("gptq", 64, sym=True, zero_minus_one=True)


def random_layer(N=48, K=256, group_size=64, sym=True, seed=0):
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(seed))
    return quantize_groups(w, group_size, sym)


def gguf_values(weight: GroupedIntWeight) -> torch.Tensor:
    """The blocks dequantised by gguf's reference code: fp64 [N, K]."""
    blocks = weight.block_rows()
    kind = {"q4_0": T.Q4_0, "q4_1": T.Q4_1, "q8_0": T.Q8_0}[weight.block_format]
    return torch.from_numpy(gguf_quants.dequantize(blocks.numpy(), kind).reshape(weight.shape)).double()


@pytest.mark.parametrize("zero_minus_one", [True, False], ids=["gptq", "gptq_v2"])
def test_symmetric_gptq_becomes_q4_0_exactly(zero_minus_one):
    q, zeros, scales = random_layer(sym=True)
    packed = pack_gptq(q, zeros, scales, 64, zero_minus_one)
    weight = gptq_awq_weight("l", GptqAwqScheme("gptq", 64, True, zero_minus_one), packed)
    expected = dequantized(q, zeros, scales, 64)
    assert weight.shape == (48, 256) and weight.block_format == "q4_0"
    assert torch.equal(gguf_values(weight), expected)  # d = scale, w = d (q - 8): bit for bit
    assert torch.equal(weight.dequantized().double(), expected)


@pytest.mark.parametrize("method, group_size", [("gptq", 32), ("gptq", -1), ("awq", 64), ("awq", 128)])
def test_asymmetric_layers_become_q4_1_within_fp16_rounding_of_the_minimum(method, group_size):
    size = 256 if group_size == -1 else group_size
    q, zeros, scales = random_layer(group_size=size, sym=False, seed=1)
    # the extremes of the zero point: AWQ 0..15; GPTQ stores zero - 1 in 4 bits, so 1..16
    zeros[0, 0], zeros[1, 0] = (0, 15) if method == "awq" else (16, 1)
    packed = pack_gptq(q, zeros, scales, size) if method == "gptq" else pack_awq(q, zeros, scales)
    weight = gptq_awq_weight("l", GptqAwqScheme(method, group_size, sym=False, zero_minus_one=method == "gptq"), packed)
    expected = dequantized(q, zeros, scales, size)
    assert weight.block_format == "q4_1"
    assert torch.equal(weight.dequantized().double(), expected)
    # m = -scale * zero rounded to fp16: off by at most 2^-11 of it, under 0.75% of a quantization step
    group = torch.arange(256) // size
    bound = 2.0**-11 * (scales.double() * zeros.double())[:, group] + 1e-12
    assert ((gguf_values(weight) - expected).abs() <= bound).all()


@settings(max_examples=40, deadline=None)
@given(method=st.sampled_from(["gptq", "awq"]), sym=st.booleans(), act_order=st.booleans(),
       n_groups_of_8=st.integers(1, 6), k_blocks=st.integers(1, 8), group_blocks=st.sampled_from([1, 2, 4, -1]),
       seed=st.integers(0, 2**16))
def test_random_layers_unpack_to_the_formula(method, sym, act_order, n_groups_of_8, k_blocks, group_blocks, seed):
    """Any shape, group size, method, symmetry and (GPTQ) act order: the weight dequantises to scale * (q - zero)
    exactly, and its blocks, read by gguf's own dequantizer, give the same values (Q4_0: bit for bit; Q4_1:
    within fp16's rounding of the minimum) in input_perm's order."""
    N, K = 8 * n_groups_of_8, 32 * k_blocks
    size = K if group_blocks == -1 or K % (32 * group_blocks) else 32 * group_blocks
    sym = sym and method == "gptq"
    act_order = act_order and method == "gptq"
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(seed))
    g_idx = None
    if act_order:
        perm = torch.randperm(K, generator=torch.Generator().manual_seed(seed + 1))
        q, zeros, scales, g_idx = quantize_act_order(w, size, sym, perm)
    else:
        q, zeros, scales = quantize_groups(w, size, sym)
    packed = pack_gptq(q, zeros, scales, size, g_idx=g_idx) if method == "gptq" else pack_awq(q, zeros, scales)
    group_size = -1 if size == K and group_blocks == -1 else size
    weight = gptq_awq_weight("l", GptqAwqScheme(method, group_size, sym, zero_minus_one=method == "gptq"), packed)
    expected = dequantized(q, zeros, scales, size, g_idx)  # fp64 [N, K]
    assert torch.equal(weight.dequantized().double(), expected)
    order = torch.arange(K) if weight.input_perm is None else weight.input_perm
    if weight.block_format == "q4_0":
        assert torch.equal(gguf_values(weight), expected[:, order])
    else:
        group = (torch.arange(K) // size if g_idx is None else g_idx)[order]
        bound = 2.0**-11 * (scales.double() * zeros.double())[:, group] + 1e-12
        assert ((gguf_values(weight) - expected[:, order]).abs() <= bound).all()


def test_gptq_zero_stored_as_15_is_16():
    """AutoGPTQ's zero - 1 storage: a stored nibble of 15 is a zero of 16 (its kernels add 1 to the nibble)."""
    q, zeros, scales = random_layer(sym=False, seed=2)
    packed = pack_gptq(q, zeros, scales, 64, zero_minus_one=False)  # raw zeros, read as zero - 1 below
    packed["qzeros"] = torch.full_like(packed["qzeros"], -1)  # every nibble 15
    weight = gptq_awq_weight("l", GptqAwqScheme("gptq", 64, sym=False, zero_minus_one=True), packed)
    assert torch.equal(weight.dequantized().double(), dequantized(q, torch.full_like(zeros, 16), scales, 64))


def test_act_order_sorts_the_inputs_by_group():
    """desc_act=True: the layer's inputs are sorted by group (stable) so each group is whole blocks; the blocks
    hold the sorted columns exactly and input_perm says which input each is."""
    w = torch.randn(48, 256, generator=torch.Generator().manual_seed(3))
    perm = torch.randperm(256, generator=torch.Generator().manual_seed(4))
    q, zeros, scales, g_idx = quantize_act_order(w, 64, True, perm)
    weight = gptq_awq_weight("l", GPTQ, pack_gptq(q, zeros, scales, 64, g_idx=g_idx))
    expected = dequantized(q, zeros, scales, 64, g_idx)
    assert torch.equal(weight.input_perm, torch.argsort(g_idx, stable=True))
    assert torch.equal(gguf_values(weight), expected[:, weight.input_perm])  # Q4_0, bit for bit
    assert torch.equal(weight.dequantized().double(), expected)  # the checkpoint's input order


def test_act_order_groups_that_split_a_block_and_wrong_shapes_are_refused():
    q, zeros, scales = random_layer()
    packed = pack_gptq(q, zeros, scales, 64)
    uneven = torch.tensor([0] * 48 + [1] * 80 + [2] * 64 + [3] * 64)[torch.randperm(256)]  # 48 + 80: not whole blocks
    with pytest.raises(ModelLoadError, match="not multiples of 32"):
        gptq_awq_weight("layer", GPTQ, dict(packed, g_idx=uneven.to(torch.int32)))
    with pytest.raises(ModelLoadError, match="expected 256 group indices below 4"):
        gptq_awq_weight("layer", GPTQ, dict(packed, g_idx=torch.full((256,), 4, dtype=torch.int32)))
    with pytest.raises(ModelLoadError, match="do not match"):
        gptq_awq_weight("layer", GptqAwqScheme("gptq", 128, True, True), dict(packed, g_idx=None))


@pytest.mark.parametrize("zero_minus_one", [True, False], ids=["gptq", "gptq_v2"])
def test_symmetric_8_bit_gptq_becomes_q8_0_exactly(zero_minus_one):
    """8-bit GPTQ (4 values an int32): sym, every zero 128, is Q8_0 with d = scale and qs = q - 128, the
    extremes 0 and 255 included (qs -128 and 127)."""
    w = torch.randn(48, 256, generator=torch.Generator().manual_seed(5))
    q, zeros, scales = quantize_groups(w, 64, sym=True, bits=8)
    q[0, :2] = torch.tensor([0, 255])
    packed = pack_gptq(q, zeros, scales, 64, zero_minus_one, bits=8)
    assert packed["qweight"].shape == (64, 48) and packed["qzeros"].shape == (4, 12)
    weight = gptq_awq_weight("l", GptqAwqScheme("gptq", 64, True, zero_minus_one, bits=8), packed)
    expected = dequantized(q, zeros, scales, 64)
    assert weight.shape == (48, 256) and weight.block_format == "q8_0"
    assert torch.equal(gguf_values(weight), expected)  # bit for bit
    assert torch.equal(weight.dequantized().double(), expected)


def test_8_bit_act_order_gptq_sorts_its_inputs():
    w = torch.randn(32, 128, generator=torch.Generator().manual_seed(6))
    perm = torch.randperm(128, generator=torch.Generator().manual_seed(7))
    q, zeros, scales, g_idx = quantize_act_order(w, 32, True, perm, bits=8)
    weight = gptq_awq_weight("l", GptqAwqScheme("gptq", 32, True, True, bits=8),
                             pack_gptq(q, zeros, scales, 32, g_idx=g_idx, bits=8))
    expected = dequantized(q, zeros, scales, 32, g_idx)
    assert weight.block_format == "q8_0" and torch.equal(weight.input_perm, torch.argsort(g_idx, stable=True))
    assert torch.equal(gguf_values(weight), expected[:, weight.input_perm])
    assert torch.equal(weight.dequantized().double(), expected)


def test_asymmetric_8_bit_weights_are_refused_with_the_fix():
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(8))
    q, zeros, scales = quantize_groups(w, 32, sym=False, bits=8)
    with pytest.raises(ModelLoadError, match="asymmetric 8-bit weights.*sym=True"):
        gptq_awq_weight("l", GptqAwqScheme("gptq", 32, False, True, bits=8), pack_gptq(q, zeros, scales, 32, bits=8))


@pytest.mark.parametrize("config, match", [
    ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "bits=3.*4- and 8-bit GPTQ"),
    ({"quant_method": "gptq", "bits": 8, "group_size": 128, "sym": False}, "8-bit GPTQ with sym=false"),
    ({"quant_method": "awq", "bits": 8, "group_size": 128}, "bits=8.*4-bit AWQ"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 16}, "multiple of 32"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "GEMM packing"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": False}, "zero_point"),
    ({"quant_method": "bitsandbytes"}, "pre-quantized 'bitsandbytes'.*GPTQ \\(4 and 8 bits\\)"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "marlin"}, "checkpoint_format"),
])
def test_schemes_the_kernels_cannot_run_are_refused(config, match):
    with pytest.raises(ModelLoadError, match=match):
        prequantized_scheme(config, "config.json")


def test_schemes_read_from_the_config():
    assert prequantized_scheme(None, "c") is None
    assert prequantized_scheme({"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": False}, "c") == \
        GptqAwqScheme("gptq", 128, sym=False, zero_minus_one=True)
    assert prequantized_scheme({"quant_method": "gptq", "bits": 8, "group_size": -1, "sym": True}, "c") == \
        GptqAwqScheme("gptq", -1, sym=True, zero_minus_one=True, bits=8)
    assert prequantized_scheme({"quant_method": "awq", "bits": 4, "group_size": 64}, "c") == \
        GptqAwqScheme("awq", 64, sym=False, zero_minus_one=False)


@pytest.fixture(scope="module")
def gptq_folder(tmp_path_factory):
    return write_gptq_awq_folder(tmp_path_factory.mktemp("gptq"), "gptq", group_size=64, sym=True)


@pytest.fixture(scope="module")
def awq_folder(tmp_path_factory):
    return write_gptq_awq_folder(tmp_path_factory.mktemp("awq"), "awq", kind="qwen2", group_size=128)


@pytest.fixture(scope="module")
def gptq8_folder(tmp_path_factory):
    return write_gptq_awq_folder(tmp_path_factory.mktemp("gptq8"), "gptq", group_size=32, sym=True, bits=8)


@pytest.mark.parametrize("which, file_format, bits", [("gptq", "q4_0", 4), ("awq", "q4_1", 4), ("gptq8", "q8_0", 8)])
def test_checkpoints_stay_quantized_and_equal_the_oracle(request, monkeypatch, which, file_format, bits):
    folder, dense = request.getfixturevalue(f"{which}_folder")
    loaded = load_model(folder, load_tokenizer=False)
    assert loaded.weight_format == which.rstrip("8") and loaded.config.dtype == "float32"
    qkv = loaded.model.model.layers[0].self_attn.qkv_proj
    assert qkv.method.formats(qkv) == [repackable(file_format, qkv.out_features) or file_format]
    assert loaded.weight_bytes[file_format] > 0 and "float32" in loaded.weight_bytes  # embedding, head, norms
    linear_bytes = sum(p.numel() for n, p in dense.named_parameters() if n.endswith("proj.weight")) * 4
    assert loaded.weight_bytes[file_format] <= linear_bytes * (bits + 1) / 32  # + d (and m) per 32, of 32
    assert loaded.model.decoder_stack_status.supported, loaded.model.decoder_stack_status.reason
    assert_same_as_oracle(folder, monkeypatch, {file_format})


def test_an_unquantized_head_runs_as_a_dense_layer(gptq_folder):
    """The untied lm_head a GPTQ checkpoint leaves in fp16 becomes the dense fp32 layer a dense checkpoint has
    (its kernel where the CPU has one), so the one-call greedy decode has a head kernel to run."""
    from pagedcore.layers.linear import DenseLinearMethod

    folder, dense = gptq_folder
    model = load_model(folder, load_tokenizer=False).model
    head = model.lm_head
    assert isinstance(head.method, DenseLinearMethod) and head.method.format == "float32"
    assert not hasattr(head, "quant_parts")
    assert torch.equal(head.weight.data, dense.lm_head.weight.data)  # reads back as [vocab, hidden], as stored
    assert head.method.kernel_for(head, torch.float32) is not None
    assert model.greedy_decoder() is not None, model.greedy_decode_reason


@pytest.fixture(scope="module")
def act_order_folder(tmp_path_factory):
    return write_gptq_awq_folder(tmp_path_factory.mktemp("act"), "gptq", group_size=32, sym=False, act_order=True)


def test_act_order_checkpoints_gather_their_inputs_and_equal_the_oracle(act_order_folder, monkeypatch):
    folder, _ = act_order_folder
    model = load_model(folder, load_tokenizer=False).model
    layer = model.model.layers[1]
    for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
        assert linear.input_perm is not None and linear.method.formats(linear)[0].startswith("q4_1")
    assert not torch.equal(layer.self_attn.qkv_proj.input_perm, layer.self_attn.o_proj.input_perm)
    assert model.decoder_stack_status.supported, model.decoder_stack_status.reason  # it gathers (test_quant_stack)
    assert_same_as_oracle(folder, monkeypatch, {"q4_1"})


def test_fused_shards_with_different_act_orders_are_refused(act_order_folder, tmp_path):
    from safetensors.torch import load_file, save_file

    folder, _ = act_order_folder
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in os.listdir(folder):
        if not name.endswith(".safetensors"):
            os.symlink(os.path.join(folder, name), bad / name)
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    # k_proj's groups in o_proj's order (same K): q/k/v share an input, so their orders must agree
    prefix = "model.layers.0.self_attn"
    tensors[f"{prefix}.k_proj.g_idx"] = tensors[f"{prefix}.o_proj.g_idx"].clone()
    save_file(tensors, str(bad / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="another act-order input permutation"):
        load_model(str(bad), load_tokenizer=False)


@pytest.mark.parametrize("which", ["gptq", "awq", "act_order"])
def test_near_the_dense_model_of_the_same_weights(request, which):
    """Against HF transformers on the dequantised weights: the kernels quantize activations to int8 per
    block of 32, so logits differ by a little (measured on these random models: at most 6.3% of the largest
    logit, 0.5% on average); HF's top token stays in our top 5 (vLLM's criterion at a divergence)."""
    folder, dense = request.getfixturevalue(f"{which}_folder")
    ours = PagedDriver(load_model(folder, load_tokenizer=False).model).step([(0, PROMPT)])
    theirs = tiny_models.hf_logits(dense, PROMPT)
    assert (ours.topk(5, -1).indices == theirs.argmax(-1)[:, None]).any(-1).all()
    assert (ours - theirs).abs().max() < 0.1 * theirs.abs().max()
    assert (ours - theirs).abs().mean() < 0.02 * theirs.abs().max()


def test_flags_follow_vllm(gptq_folder, tmp_path):
    folder, _ = gptq_folder
    assert quantization_error("gptq") is None and quantization_error("awq") is None
    assert "gptq / awq" in quantization_error("gptq_marlin")
    assert load_model(folder, quantization="gptq", load_tokenizer=False).weight_format == "gptq"
    with pytest.raises(ModelLoadError, match="a gptq checkpoint; --quantization awq"):
        load_model(folder, quantization="awq", load_tokenizer=False)
    with pytest.raises(ModelLoadError, match="float32 activations"):
        load_model(folder, dtype="bfloat16", load_tokenizer=False)
    plain = tiny_models.save_hf_folder(tiny_models.build_hf_model("llama"), tmp_path / "plain")
    with pytest.raises(ModelLoadError, match="is not one"):
        load_model(plain, quantization="awq", load_tokenizer=False)
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"]["desc_act"] = True  # the flag alone is fine: g_idx decides (here k // 64)
    bad = tmp_path / "act_order"
    bad.mkdir()
    for name in os.listdir(folder):
        if name != "config.json":
            os.symlink(os.path.join(folder, name), bad / name)
    with open(bad / "config.json", "w") as f:
        json.dump(config, f)
    assert load_model(str(bad), load_tokenizer=False).weight_format == "gptq"


def test_the_engine_serves_it_with_a_bf16_cache_as_for_a_gguf(gptq_folder):
    folder, _ = gptq_folder
    llm = LLM(folder, max_model_len=128)
    assert llm.llm_engine.config.kv_cache_dtype == "bfloat16"  # "auto" for blocks as stored on the CPU
    (out,) = llm.generate([{"prompt_token_ids": PROMPT}], SamplingParams(max_tokens=6, temperature=0.0))
    assert len(out.outputs[0].token_ids) == 6
    assert np.all(np.array(out.outputs[0].token_ids) < tiny_models.VOCAB_SIZE)
    with pytest.raises(ValueError, match="kept quantized \\(gptq\\).*CPU only; use --device cpu"):
        LLM(folder, device="cuda")  # refused before anything moves to a GPU (none is needed to check)
