"""compressed-tensors checkpoints (loader/compressed_tensors_checkpoint.py) kept quantized: W8A8 int8 layers
hold their stored int8 rows and scales on the int8_per_channel kernel, weight-only int4 / int8 layers become
Q4_0 / Q4_1 / Q8_0 blocks equal to the format's formula (exactly but Q4_1's fp16 minimum); whole runs equal
the float64 oracle; what the kernels cannot run is refused with the fix."""

from __future__ import annotations

import copy

import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf import quants as gguf_quants
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedcore import LLM, SamplingParams
from pagedcore.loader import ModelLoadError, load_model
from pagedcore.loader.compressed_tensors_checkpoint import (CompressedTensorsScheme, compressed_tensors_scheme,
                                                           compressed_tensors_weight, compressed_tensors_weights)
from pagedcore.loader.integer_weight import ChannelInt8Weight, GroupedIntWeight
from pagedcore.ops.quant_repack import repackable

from ..models import tiny_models
from ..models.paged_driver import PagedDriver
from .compressed_tensors_checkpoints import (SCHEMES, dequantized, layer_tensors, quantization_config, quantize,
                                             write_compressed_tensors_folder)
from .test_quantized_models import PROMPT, assert_same_as_oracle


def scheme_of(name: str) -> CompressedTensorsScheme:
    return compressed_tensors_scheme(quantization_config(name), "config.json")


def random_layer(name: str, N=48, K=256, seed=0, scale_dtype=torch.bfloat16):
    fmt, bits, strategy, group_size, symmetric, _, actorder = SCHEMES[name]
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(seed))
    perm = torch.randperm(K, generator=torch.Generator().manual_seed(seed + 1)) if actorder else None
    q, scales, zp, g_idx = quantize(w, bits, strategy, group_size, symmetric, scale_dtype, perm)
    return (q, scales, zp, g_idx), layer_tensors(q, scales, zp, g_idx, fmt, bits, symmetric, strategy)


def gguf_values(weight: GroupedIntWeight) -> torch.Tensor:
    kind = {"q4_0": T.Q4_0, "q4_1": T.Q4_1, "q8_0": T.Q8_0}[weight.block_format]
    return torch.from_numpy(gguf_quants.dequantize(weight.block_rows().numpy(), kind).reshape(weight.shape)).double()


def test_schemes_read_from_the_config():
    assert scheme_of("w8a8") == CompressedTensorsScheme("int-quantized", 8, "channel", None, True, True)
    assert scheme_of("w4a16") == CompressedTensorsScheme("pack-quantized", 4, "group", 64, True, False)
    assert scheme_of("w4a16-actorder").act_order and not scheme_of("w4a16").act_order


@pytest.mark.parametrize("name, block_format", [("w4a16", "q4_0"), ("w4a16-channel", "q4_0"), ("w8a16", "q8_0"),
                                                ("w4a16-naive", "q4_0")])
def test_symmetric_weight_only_layers_become_blocks_exactly(name, block_format):
    """d = scale (bf16 scales in fp16's range are exact in fp16), q stored as q + 2^(b-1): the blocks read by
    gguf's own dequantizer equal scale * q bit for bit, the range's ends (-2^(b-1), 2^(b-1) - 1) included."""
    (q, scales, zp, g_idx), tensors = random_layer(name)
    assert q.min() == -(1 << (SCHEMES[name][1] - 1))  # symmetric scales over 2^b - 1 steps reach qmin
    weight = compressed_tensors_weight("l", scheme_of(name), tensors)
    expected = dequantized(q, scales, zp)
    assert isinstance(weight, GroupedIntWeight) and weight.block_format == block_format
    assert torch.equal(gguf_values(weight), expected)
    assert torch.equal(weight.dequantized().double(), expected)


def test_asymmetric_4_bit_layers_become_q4_1_within_fp16_rounding_of_the_minimum():
    (q, scales, zp, _), tensors = random_layer("w4a16-asym", seed=2)
    assert "weight_zero_point" in tensors and tensors["weight_zero_point"].shape == (6, 8)  # packed along N
    weight = compressed_tensors_weight("l", scheme_of("w4a16-asym"), tensors)
    expected = dequantized(q, scales, zp)
    assert weight.block_format == "q4_1" and torch.equal(weight.dequantized().double(), expected)
    group = torch.arange(256) // 32
    bound = 2.0**-11 * (scales.double() * (zp.double() + 8).abs())[:, group] + 1e-12
    assert ((gguf_values(weight) - expected).abs() <= bound).all()


@pytest.mark.parametrize("name", ["w8a8", "w8a8-tensor"])
def test_w8a8_layers_keep_their_int8_rows_and_scales(name):
    """The int8_per_channel kernel's operands are the stored ones: q as stored, the bf16 scale widened to fp32
    exactly (one scale per row; a tensor scale repeated)."""
    (q, scales, zp, _), tensors = random_layer(name, seed=3)
    weight = compressed_tensors_weight("l", scheme_of(name), tensors)
    assert isinstance(weight, ChannelInt8Weight)
    values, row_scales = weight.int8_rows()
    assert torch.equal(values, q.to(torch.int8)) and (values.min() == -128 or name == "w8a8-tensor")
    assert torch.equal(row_scales, scales[:, 0].float()) and row_scales.dtype == torch.float32
    assert torch.equal(weight.dequantized().double(), dequantized(q, scales, zp))


def test_scales_saved_1_d_are_one_a_row_and_a_misfit_is_refused():
    (q, scales, zp, _), tensors = random_layer("w8a8", seed=9)
    weight = compressed_tensors_weight("l", scheme_of("w8a8"), dict(tensors, weight_scale=scales.reshape(-1)))
    assert torch.equal(weight.int8_rows()[1], scales[:, 0].float())
    for bad in (scales[:7, 0], scales.reshape(-1)[:5].reshape(1, 5)):
        with pytest.raises(ModelLoadError, match="weight_scale .* does not fit the weight \\[48, 256\\]"):
            compressed_tensors_weight("l", scheme_of("w8a8"), dict(tensors, weight_scale=bad))


def test_act_order_layers_sort_their_inputs_by_group():
    (q, scales, zp, g_idx), tensors = random_layer("w4a16-actorder", seed=4)
    weight = compressed_tensors_weight("l", scheme_of("w4a16-actorder"), tensors)
    expected = dequantized(q, scales, zp, g_idx)
    assert torch.equal(weight.input_perm, torch.argsort(g_idx, stable=True))
    assert torch.equal(gguf_values(weight), expected[:, weight.input_perm])
    assert torch.equal(weight.dequantized().double(), expected)


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(sorted(SCHEMES)), n_groups_of_8=st.integers(1, 6), k_blocks=st.integers(1, 8),
       fp16_scales=st.booleans(), seed=st.integers(0, 2**16))
def test_random_layers_unpack_to_the_formula(name, n_groups_of_8, k_blocks, fp16_scales, seed):
    fmt, bits, strategy, group_size, symmetric, w8a8, actorder = SCHEMES[name]
    N, K = 8 * n_groups_of_8, 32 * k_blocks
    if strategy == "group" and K % group_size:
        K = group_size * k_blocks
    (q, scales, zp, g_idx), tensors = random_layer(name, N, K, seed, torch.float16 if fp16_scales else torch.bfloat16)
    config = quantization_config(name)
    weight = compressed_tensors_weight("l", compressed_tensors_scheme(config, "c"), tensors)
    expected = dequantized(q, scales, zp, g_idx)
    assert torch.equal(weight.dequantized().double(), expected)
    if w8a8:
        return
    order = torch.arange(K) if weight.input_perm is None else weight.input_perm
    if weight.block_format != "q4_1":
        assert torch.equal(gguf_values(weight), expected[:, order])
    else:
        group = (torch.arange(K) // (K // scales.shape[1]) if g_idx is None else g_idx)[order]
        bound = 2.0**-11 * (scales.double() * (zp.double() + 8).abs())[:, group] + 1e-12
        assert ((gguf_values(weight) - expected[:, order]).abs() <= bound).all()


def _config(name="w4a16", weights=None, activations="keep", **top):
    config = copy.deepcopy(quantization_config(name))
    group = config["config_groups"]["group_0"]
    group["weights"].update(weights or {})
    if activations != "keep":
        group["input_activations"] = activations
    config.update(top)
    return config


W8A8_ACTIVATIONS = quantization_config("w8a8")["config_groups"]["group_0"]["input_activations"]


@pytest.mark.parametrize("config, match", [
    (_config(format="float-quantized"), "float-quantized weights of type int and 4 bits"),
    (_config(format="nvfp4-pack-quantized"), "format 'nvfp4-pack-quantized'"),
    (_config(weights={"type": "float"}), "float weights of 4 bits"),
    (_config(weights={"num_bits": 2}), "weights of 2 bits"),
    (_config(weights={"group_size": 16}), "group_size=16.*multiple of 32"),
    (_config(weights={"strategy": "block", "block_structure": [128, 128]}), "strategy 'block'"),
    (_config("w8a16", weights={"symmetric": False}), "asymmetric 8-bit weights"),
    (_config("w8a8", activations=dict(W8A8_ACTIVATIONS, dynamic=False, strategy="tensor")), "dynamic=False"),
    (_config("w8a8", activations=dict(W8A8_ACTIVATIONS, symmetric=False)), "symmetric=False"),
    (_config("w4a16", activations=W8A8_ACTIVATIONS), "with 4-bit group weights"),
    (_config(sparsity_config={"format": "sparse-24-bitmask"}), "sparse"),
    (_config(kv_cache_scheme={"num_bits": 8, "type": "float"}), "kv-cache scales.*--kv-cache-dtype"),
    (_config(transform_config={"config_groups": {}}), "rotation transforms"),
    (_config(config_groups={}), "without config_groups"),
])
def test_schemes_the_kernels_cannot_run_are_refused(config, match):
    with pytest.raises(ModelLoadError, match=match):
        compressed_tensors_scheme(config, "config.json")


def test_mixed_precision_groups_and_static_activation_scales_are_refused():
    config = _config()
    config["config_groups"]["group_1"] = copy.deepcopy(quantization_config("w8a16")["config_groups"]["group_0"])
    with pytest.raises(ModelLoadError, match="different schemes"):
        compressed_tensors_scheme(config, "c")
    _, tensors = random_layer("w8a8")
    stream = [(f"layer.{k}", v) for k, v in tensors.items()] + [("layer.input_scale", torch.ones(1))]
    with pytest.raises(ModelLoadError, match="static activation scales"):
        list(compressed_tensors_weights(iter(stream), scheme_of("w8a8"), "m"))


def test_the_stream_waits_for_a_layer_split_over_shards_and_passes_float_tensors():
    (q, scales, zp, _), tensors = random_layer("w4a16")
    head = torch.randn(8, 4)
    stream = [("a.weight_scale", tensors["weight_scale"]), ("lm_head.weight", head),
              ("a.weight_shape", tensors["weight_shape"]), ("a.weight_packed", tensors["weight_packed"])]
    out = list(compressed_tensors_weights(iter(stream), scheme_of("w4a16"), "m"))
    assert [name for name, _ in out] == ["lm_head.weight", "a.weight"]
    assert out[0][1] is head and torch.equal(out[1][1].dequantized().double(), dequantized(q, scales, zp))
    with pytest.raises(ModelLoadError, match="has \\['weight_scale'\\] but not \\['weight_packed', 'weight_shape'\\]"):
        list(compressed_tensors_weights(iter(stream[:1]), scheme_of("w4a16"), "m"))
    plain = ("a.weight_g_idx", torch.arange(256, dtype=torch.int32) // 64)  # saved without actorder "group"
    out = list(compressed_tensors_weights(iter([plain, *stream]), scheme_of("w4a16"), "m"))
    assert [name for name, _ in out] == ["lm_head.weight", "a.weight"] and out[1][1].input_perm is None
    shuffled = ("a.weight_g_idx", plain[1][torch.randperm(256)])
    with pytest.raises(ModelLoadError, match="reordering weight_g_idx.*actorder 'group'"):
        list(compressed_tensors_weights(iter([shuffled, *stream]), scheme_of("w4a16"), "m"))


FOLDERS = {"w8a8": ("llama", "int8_per_channel"), "w4a16": ("llama", "q4_0"), "w4a16-asym": ("qwen2", "q4_1"),
           "w4a16-actorder": ("llama", "q4_0"), "w8a16": ("llama", "q8_0")}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {name: write_compressed_tensors_folder(tmp_path_factory.mktemp(name), name, kind)
            for name, (kind, _) in FOLDERS.items()}


@pytest.mark.parametrize("name", sorted(FOLDERS))
def test_checkpoints_stay_quantized_and_equal_the_oracle(folders, monkeypatch, name):
    folder, dense = folders[name]
    file_format = FOLDERS[name][1]
    loaded = load_model(folder, load_tokenizer=False)
    assert loaded.weight_format == "compressed-tensors" and loaded.config.dtype == "float32"
    qkv = loaded.model.model.layers[0].self_attn.qkv_proj
    assert qkv.method.formats(qkv) == [repackable(file_format, qkv.out_features, K=qkv.in_features) or file_format]
    assert (qkv.input_perm is not None) == (name == "w4a16-actorder")
    linear_bytes = sum(p.numel() for n, p in dense.named_parameters() if n.endswith("proj.weight")) * 4
    bits = 8 if file_format in ("q8_0", "int8_per_channel") else 4
    assert 0 < loaded.weight_bytes[file_format] <= linear_bytes * (bits + 1) / 32
    assert "float32" in loaded.weight_bytes  # the embedding, the ignored lm_head, norms
    assert loaded.model.decoder_stack_status.supported, loaded.model.decoder_stack_status.reason
    assert_same_as_oracle(folder, monkeypatch, {file_format})


@pytest.mark.parametrize("name", ["w8a8", "w4a16", "w4a16-actorder"])
def test_near_the_dense_model_of_the_same_weights(folders, name):
    """Against HF transformers on the dequantised weights (the kernels quantize activations to int8: per
    token for W8A8, as the checkpoint says; per block of 32 for the weight-only schemes): HF's top token in
    our top 5, logits within a few percent of the largest."""
    folder, dense = folders[name]
    ours = PagedDriver(load_model(folder, load_tokenizer=False).model).step([(0, PROMPT)])
    theirs = tiny_models.hf_logits(dense, PROMPT)
    assert (ours.topk(5, -1).indices == theirs.argmax(-1)[:, None]).any(-1).all()
    assert (ours - theirs).abs().max() < 0.1 * theirs.abs().max()
    assert (ours - theirs).abs().mean() < 0.02 * theirs.abs().max()


def test_the_ignored_head_is_dense_and_the_flags_follow_vllm(folders):
    from pagedcore.layers.linear import DenseLinearMethod

    folder, dense = folders["w8a8"]
    model = load_model(folder, quantization="compressed-tensors", load_tokenizer=False).model
    assert isinstance(model.lm_head.method, DenseLinearMethod)
    assert torch.equal(model.lm_head.weight.data, dense.lm_head.weight.data)
    with pytest.raises(ModelLoadError, match="a compressed-tensors checkpoint; --quantization gptq"):
        load_model(folder, quantization="gptq", load_tokenizer=False)
    with pytest.raises(ModelLoadError, match="float32 activations"):
        load_model(folder, dtype="bfloat16", load_tokenizer=False)


def test_the_engine_serves_one(folders):
    folder, _ = folders["w8a8"]
    llm = LLM(folder, max_model_len=128)
    assert llm.llm_engine.config.kv_cache_dtype == "bfloat16"  # as for a GGUF's blocks on the CPU
    (out,) = llm.generate([{"prompt_token_ids": PROMPT}], SamplingParams(max_tokens=6, temperature=0.0))
    assert len(out.outputs[0].token_ids) == 6


@pytest.mark.parametrize("kind", ["llama", "llama_tied"])
def test_bf16_tables_and_heads_are_held_bf16_and_give_the_logits_of_fp32_copies(tmp_path, kind):
    """An unquantized lm_head and token table stored bf16 (as llm-compressor keeps a bf16 model's) are held
    bf16, half an fp32 copy's bytes, under the model's fp32 activations: lookups widen rows exactly and the
    head's kernel widens the weights, so logits equal those of the same values held fp32 (bit for bit where both
    run the x16 layouts; within fp32 rounding where the row layouts' kernels sum in other orders); the one-call
    greedy decode runs (its C++ lookup widens too)."""
    import shutil

    from safetensors.torch import load_file, save_file

    from pagedcore.layers.linear import BF16_WEIGHTS_FP32_ACTIVATIONS
    from pagedcore.ops.dense_repack import X16Weight

    bf16_folder, dense = write_compressed_tensors_folder(tmp_path / "bf16", "w8a8", kind, float_dtype=torch.bfloat16)
    fp32_folder = shutil.copytree(bf16_folder, tmp_path / "fp32")  # the same values, stored fp32
    tensors = {name: t.float() if t.dtype is torch.bfloat16 else t
               for name, t in load_file(fp32_folder / "model.safetensors").items()}
    save_file(tensors, str(fp32_folder / "model.safetensors"), metadata={"format": "pt"})
    loaded = load_model(bf16_folder, load_tokenizer=False)
    model = loaded.model
    embed = model.model.embed_tokens
    assert embed.weight.dtype == torch.bfloat16 and embed.dtype == torch.float32
    assert torch.equal(embed(torch.tensor([3, 0, 511])), dense.model.embed_tokens.weight.data[[3, 0, 511]])
    table_bytes = embed.weight.numel() * 2
    if kind == "llama":
        head = model.lm_head
        assert head.method is BF16_WEIGHTS_FP32_ACTIVATIONS and head.weight.dtype == torch.bfloat16
        assert torch.equal(head.weight.data.float(), dense.lm_head.weight.data)
        assert head.method.kernel_for(head, torch.float32) is not None
        assert loaded.weight_bytes["bfloat16"] == table_bytes + head.weight.numel() * 2
        many_rows = head(torch.randn(70000, head.in_features))  # past the kernel's rows: torch widens W
        assert many_rows.dtype == torch.float32 and many_rows.shape == (70000, head.out_features)
    else:
        assert model.lm_head is None and embed.head_kernel(torch.float32) is not None
        assert loaded.weight_bytes["bfloat16"] == table_bytes
    assert model.greedy_decoder() is not None, model.greedy_decode_reason
    fp32_model = load_model(str(fp32_folder), load_tokenizer=False).model
    assert fp32_model.model.embed_tokens.weight.dtype == torch.float32
    ours, theirs = PagedDriver(model).step([(0, PROMPT)]), PagedDriver(fp32_model).step([(0, PROMPT)])
    heads = [m.lm_head.weight if kind == "llama" else m.model.embed_tokens.weight for m in (model, fp32_model)]
    if all(type(w) is X16Weight for w in heads):  # both x16 (AVX512-BF16 CPUs): the same sums, in the same order
        assert torch.equal(ours, theirs)
    else:  # a row layout's kernels (AVX2) sum the two dtypes' layouts in different orders: fp32 rounding apart
        assert (ours - theirs).abs().max() <= 1e-5 * theirs.abs().max()
    llm_tokens = []
    for folder in (bf16_folder, str(fp32_folder)):  # the one-call decode (C++ lookup and head) on both
        (out,) = LLM(folder, max_model_len=128).generate([{"prompt_token_ids": PROMPT}],
                                                          SamplingParams(max_tokens=8, temperature=0.0))
        llm_tokens.append(out.outputs[0].token_ids)
    assert llm_tokens[0] == llm_tokens[1]
