"""FP8 checkpoints (loader/fp8_checkpoint.py: quant_method "fp8" and compressed-tensors "float-quantized") kept as
stored: each layer holds the checkpoint's e4m3 bytes and one fp32 scale per output row, and the kernels widen them
under fp32 activations (weight-only), so a model computes its dequantised weights' fp32 model: every kernel call
equals the float64 oracle, greedy equals HF transformers on the dequantised weights. --quantization fp8 quantizes a
dense checkpoint at load the same way (one scale per row). What the kernels cannot run is refused with the fix."""

from __future__ import annotations

import copy

import pytest
import torch

from pagedcore import LLM, SamplingParams
from pagedcore.loader import ModelLoadError, load_model
from pagedcore.loader.compressed_tensors_checkpoint import compressed_tensors_scheme
from pagedcore.loader.fp8_checkpoint import Fp8Scheme, Fp8Weight, fp8_scheme, fp8_weights, quantize_fp8_per_channel
from pagedcore.loader.quantization import prequantized_scheme
from pagedcore.ops.quant_repack import repackable

from ..engine.conftest import hf_greedy
from ..models import tiny_models
from ..models.paged_driver import PagedDriver
from ..models.test_llama_parity import random_prompt
from .fp8_checkpoints import SCHEMES, dequantized, layer_tensors, quantization_config, quantize, write_fp8_folder
from .test_quantized_models import PROMPT, assert_same_as_oracle


def test_schemes_read_from_the_config():
    assert prequantized_scheme(quantization_config("fp8-dynamic"), "c") == Fp8Scheme("fp8", False)
    assert prequantized_scheme(quantization_config("fp8-static"), "c") == Fp8Scheme("fp8", True)
    assert compressed_tensors_scheme(quantization_config("ct-fp8-dynamic"), "c") == Fp8Scheme("compressed-tensors",
                                                                                              False)
    assert compressed_tensors_scheme(quantization_config("ct-fp8-static"), "c") == Fp8Scheme("compressed-tensors",
                                                                                             True)
    assert prequantized_scheme(quantization_config("fp8-block"), "c") == Fp8Scheme("fp8", False, (128, 128))
    assert compressed_tensors_scheme(quantization_config("ct-fp8-block"), "c") == Fp8Scheme("compressed-tensors",
                                                                                            False, (32, 64))


def _ct(**weights) -> dict:
    config = copy.deepcopy(quantization_config("ct-fp8-dynamic"))
    config["config_groups"]["group_0"]["weights"].update(weights)
    return config


@pytest.mark.parametrize("config, match", [
    ({"quant_method": "fp8", "weight_block_size": [100, 128]}, "blocks whose rows are a multiple of 16"),
    ({"quant_method": "fp8", "weight_block_size": [128]}, r"block size \[128\]; expected \[rows, inputs\]"),
    ({"quant_method": "fp8", "fmt": "e5m2"}, "format 'e5m2'.*e4m3"),
    ({"quant_method": "fp8", "kv_cache_quant_algo": "FP8"}, "kv-cache scales.*--kv-cache-dtype"),
    ({"quant_method": "fp8", "activation_scheme": "per-head"}, "activation_scheme 'per-head'"),
    (_ct(strategy="block", block_structure=[128, 6]), "inputs a multiple of 4"),
    (_ct(strategy="group", group_size=128), "'group' scales"),
    (_ct(num_bits=4), "float-quantized weights of type float and 4 bits"),
    (_ct(symmetric=False), "asymmetric fp8"),
])
def test_what_the_kernels_cannot_run_is_refused(config, match):
    with pytest.raises(ModelLoadError, match=match):
        prequantized_scheme(config, "config.json")


def test_a_layer_keeps_the_stored_bytes_and_one_scale_a_row():
    w = torch.randn(48, 64, generator=torch.Generator().manual_seed(0))
    for strategy, scale_dtype in (("channel", torch.bfloat16), ("tensor", torch.float32)):
        q, scales = quantize(w, strategy, scale_dtype)
        weight = Fp8Weight("l", q, scales.reshape(-1, 1) if strategy == "channel" else scales.reshape(()))
        codes, row_scales = weight.fp8_rows()
        assert codes.dtype == torch.uint8 and torch.equal(codes, q.view(torch.uint8))
        assert row_scales.shape == (48,) and torch.equal(row_scales, scales.float().reshape(-1).expand(48))
        assert torch.equal(weight.dequantized(), dequantized(q, scales).float())  # one rounding to fp32
    with pytest.raises(ModelLoadError, match="weight_scale \\(3,\\) does not fit the weight \\(48, 64\\)"):
        Fp8Weight("l", q, torch.ones(3))
    with pytest.raises(ModelLoadError, match="non-finite"):
        Fp8Weight("l", q, torch.full((48,), float("inf")))
    with pytest.raises(ModelLoadError, match="an fp8 e4m3 \\[out, in\\] weight was expected"):
        Fp8Weight("l", w.to(torch.float8_e5m2), torch.ones(48))


def test_a_tensor_parallel_cut_keeps_the_bytes_and_scales():
    q, scales = quantize(torch.randn(48, 64, generator=torch.Generator().manual_seed(2)), "channel", torch.float32)
    scales = scales.reshape(-1)  # fp32 [48]
    weight = Fp8Weight("l", q, scales.reshape(-1, 1))
    rows, cols = weight.narrow(0, 16, 16), weight.narrow(1, 32, 32)
    assert rows.shape == (16, 64) and cols.shape == (48, 32)
    assert torch.equal(rows.fp8_rows()[0], q.view(torch.uint8)[16:32])
    assert torch.equal(rows.fp8_rows()[1], scales[16:32])
    assert torch.equal(cols.fp8_rows()[0], q.view(torch.uint8)[:, 32:]) and torch.equal(cols.fp8_rows()[1], scales)
    assert torch.equal(cols.dequantized(), weight.dequantized()[:, 32:])
    with pytest.raises(ValueError, match="dim 0 or 1"):
        weight.narrow(2, 0, 1)


def test_block_scales_are_held_per_16_rows_and_cut_on_blocks():
    """A [ceil(N / bn), ceil(K / bk)] table (last blocks partial) becomes one scale per 16-row group and k-block; the
    dequantised values are the format's definition; a tensor-parallel cut keeps its groups' and blocks' scales."""
    from .fp8_checkpoints import BLOCK_SIZES

    w = torch.randn(96, 200, generator=torch.Generator().manual_seed(3))
    block = BLOCK_SIZES["ct-fp8-block"]  # 32 x 64: 3 x 4 blocks, the last column of blocks 8 wide
    q, table = quantize(w, "block", torch.bfloat16, block)
    weight = Fp8Weight("l", q, table, block)
    codes, scales = weight.fp8_rows()
    assert torch.equal(codes, q.view(torch.uint8)) and weight.block_k == 64
    assert scales.shape == (6, 4) and torch.equal(scales, table.float().repeat_interleave(2, 0))
    assert torch.equal(weight.dequantized(), dequantized(q, table, block).float())
    rows, cols = weight.narrow(0, 32, 48), weight.narrow(1, 128, 72)  # rows on groups; inputs from a block edge
    assert torch.equal(rows.dequantized(), weight.dequantized()[32:80]) and rows.fp8_rows()[1].shape == (3, 4)
    assert torch.equal(cols.dequantized(), weight.dequantized()[:, 128:]) and cols.fp8_rows()[1].shape == (6, 2)
    with pytest.raises(ValueError, match="cut on 64-input boundaries"):
        weight.narrow(1, 32, 64)
    with pytest.raises(ModelLoadError, match=r"block-wise weight scales \(2, 4\) do not fit"):
        Fp8Weight("l", q, table[:2], block)
    with pytest.raises(ModelLoadError, match="90 output rows"):
        Fp8Weight("l", q[:90], table, block)


def test_the_stream_pairs_weights_with_scales_and_drops_input_scales():
    q, scales = quantize(torch.randn(16, 32), "tensor", torch.float32)
    tensors = layer_tensors(q, scales, "fp8-static")
    head = torch.randn(8, 4)
    stream = [("a.input_scale", tensors["input_scale"]), ("a.weight", tensors["weight"]), ("lm_head.weight", head),
              ("a.weight_scale", tensors["weight_scale"])]
    out = list(fp8_weights(iter(stream), Fp8Scheme("fp8", True), "m"))
    assert [name for name, _ in out] == ["lm_head.weight", "a.weight"] and out[0][1] is head
    assert torch.equal(out[1][1].dequantized(), dequantized(q, scales).float())
    with pytest.raises(ModelLoadError, match="a has \\['weight'\\] but not \\['weight_scale'\\]"):
        list(fp8_weights(iter(stream[:2]), Fp8Scheme("fp8", True), "m"))
    for extra, match in ((("a.k_scale", torch.ones(())), "kv-cache scales"),
                         (("a.weight_scale_inv", torch.ones(1, 1)), r"a has \['weight_scale'\] but not \['weight'\]")):
        with pytest.raises(ModelLoadError, match=match):
            list(fp8_weights(iter([*stream, extra]), Fp8Scheme("fp8", True), "m"))


def test_quantization_at_load_rounds_each_row_to_e4m3():
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(1)) * torch.linspace(0.01, 3, 32)[:, None]
    w[5] = 0.0  # a zero row keeps scale 1
    codes, scales = quantize_fp8_per_channel(w)
    q, expected = quantize(w, "channel", torch.float32)
    assert torch.equal(scales[5], torch.tensor(1.0)) and torch.all(codes[5] == 0)
    rows = torch.arange(32) != 5
    assert torch.equal(scales[rows], expected.reshape(-1)[rows])
    assert torch.equal(codes[rows], q.view(torch.uint8)[rows])
    values = codes.view(torch.float8_e4m3fn).float() * scales[:, None]
    assert (values - w).abs().max() <= (w.abs().amax(1) / 16).max()  # e4m3: 3 mantissa bits, half a step


FOLDERS = {name: "llama" if name != "ct-fp8-static" else "qwen2" for name in SCHEMES}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {name: write_fp8_folder(tmp_path_factory.mktemp(name), name, kind) for name, kind in FOLDERS.items()}


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_checkpoints_stay_fp8_and_equal_the_oracle(folders, monkeypatch, name):
    folder, dense = folders[name]
    loaded = load_model(folder, load_tokenizer=False)
    assert loaded.weight_format == SCHEMES[name][0] and loaded.config.dtype == "float32"
    qkv = loaded.model.model.layers[0].self_attn.qkv_proj
    assert qkv.method.formats(qkv) == [repackable("fp8_e4m3", qkv.out_features, K=qkv.in_features) or "fp8_e4m3"]
    linear_bytes = sum(p.numel() for n, p in dense.named_parameters() if n.endswith("proj.weight"))
    assert linear_bytes < loaded.weight_bytes["fp8_e4m3"] < linear_bytes * 1.1  # a byte a weight, + the scales
    assert loaded.model.decoder_stack_status.supported, loaded.model.decoder_stack_status.reason
    assert_same_as_oracle(folder, monkeypatch, {"fp8_e4m3"})


@pytest.mark.parametrize("name", ["ct-fp8-dynamic", "fp8-static", "ct-fp8-static", "fp8-block", "ct-fp8-block"])
def test_greedy_equals_hf_transformers_on_the_dequantised_weights(folders, name):
    folder, dense = folders[name]
    model = load_model(folder, load_tokenizer=False).model
    assert model.greedy_decoder() is not None, model.greedy_decode_reason
    prompt = random_prompt(30, seed=5)
    tokens, logits = PagedDriver(model, seed=1).greedy(0, prompt, 8, prefill_split=12)
    assert tokens == hf_greedy(dense, prompt, 8)
    reference = tiny_models.hf_logits(dense, prompt)[-1]
    assert (logits[0] - reference).abs().max() <= 1e-4 * reference.abs().max()


def test_quantization_fp8_quantizes_a_dense_checkpoint_at_load(tmp_path, monkeypatch):
    model = tiny_models.build_hf_model("llama")
    folder = tiny_models.save_hf_folder(model, tmp_path / "dense")
    loaded = load_model(folder, quantization="fp8", load_tokenizer=False)
    assert loaded.weight_format == "fp8_per_channel" and loaded.config.dtype == "float32"
    down = loaded.model.model.layers[1].mlp.down_proj
    (part,) = down.quant_parts
    codes, scales = quantize_fp8_per_channel(model.model.layers[1].mlp.down_proj.weight.detach())
    assert torch.equal(part.scales, scales)
    if part.format.endswith("x16"):
        from pagedcore.ops.quant_repack import unpack_x16

        assert torch.equal(unpack_x16(part.weight, part.format, down.in_features), codes)
    else:
        assert torch.equal(part.weight, codes)
    assert loaded.model.decoder_stack_status.supported, loaded.model.decoder_stack_status.reason
    from pagedcore.layers.linear import LINEAR_METHODS

    # the untied lm_head stays dense, as vLLM's online fp8 leaves it
    assert not model.config.tie_word_embeddings and loaded.model.lm_head.method is LINEAR_METHODS["float32"]
    assert torch.equal(loaded.model.lm_head.weight, model.lm_head.weight.detach())
    assert_same_as_oracle(folder_with_quantization(monkeypatch, folder), monkeypatch, {"fp8_e4m3"})
    in_bf16 = load_model(folder, dtype="bfloat16", quantization="fp8", load_tokenizer=False)
    assert in_bf16.weight_format == "fp8_per_channel" and in_bf16.config.dtype == "bfloat16"
    assert in_bf16.model.lm_head.method is LINEAR_METHODS["bfloat16"]
    (part16,) = in_bf16.model.model.layers[1].mlp.down_proj.quant_parts
    assert torch.equal(part16.weight, part.weight) and torch.equal(part16.scales, part.scales)
    with pytest.raises(ModelLoadError, match="runs float32 activations"):
        load_model(folder, dtype="bfloat16", quantization="int8_per_channel", load_tokenizer=False)


def folder_with_quantization(monkeypatch, folder: str) -> str:
    """assert_same_as_oracle loads by path alone: make its load_model quantize to fp8."""
    import pagedcore.loader as loader_module

    from . import test_quantized_models

    real = loader_module.load_model
    monkeypatch.setattr(test_quantized_models, "load_model",
                        lambda path, **kwargs: real(path, quantization="fp8", **kwargs))
    return folder


def test_a_checkpoint_method_other_than_the_flag_is_refused(folders):
    folder, _ = folders["ct-fp8-dynamic"]
    with pytest.raises(ModelLoadError, match="compressed-tensors checkpoint; --quantization fp8 does not apply"):
        load_model(folder, quantization="fp8", load_tokenizer=False)


@pytest.mark.parametrize("name", ["ct-fp8-dynamic", "fp8-dynamic", "fp8-block"])
def test_bfloat16_activations_keep_the_fp8_layers_and_stay_close_to_hf(folders, name):
    """--dtype bfloat16: each layer keeps the same e4m3 bytes and scales as under fp32 and multiplies bf16 x (the
    bf16 pair dot where the CPU has it: exact bf16 weights); the ignored lm_head is a dense bf16 layer, the table
    and the KV cache bf16; the decoder stack and the one-call decode take the model. bf16 drifts as a dense bf16
    model does (tests/models/test_llama_parity.py's bound): near HF fp32 on the dequantised weights, its top token
    in HF's top 5."""
    folder, dense = folders[name]
    loaded = load_model(folder, dtype="bfloat16", load_tokenizer=False)
    model, fp32 = loaded.model, load_model(folder, load_tokenizer=False).model
    assert loaded.config.dtype == "bfloat16" and loaded.weight_format == SCHEMES[name][0]
    for path in ("model.layers.0.self_attn.qkv_proj", "model.layers.1.mlp.down_proj"):
        (part,), (part32,) = model.get_submodule(path).quant_parts, fp32.get_submodule(path).quant_parts
        assert part.format == part32.format and part.format.startswith("fp8_e4m3")
        assert torch.equal(part.weight, part32.weight) and torch.equal(part.scales, part32.scales)
    from pagedcore.layers.linear import LINEAR_METHODS

    assert model.lm_head.method is LINEAR_METHODS["bfloat16"] and model.lm_head.weight.dtype == torch.bfloat16
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert model.decoder_stack_status.supported, model.decoder_stack_status.reason
    assert model.greedy_decoder() is not None, model.greedy_decode_reason
    driver = PagedDriver(model)
    assert driver.kv_cache.dtype == torch.bfloat16
    prompt = random_prompt(21, seed=1)
    logits = driver.step([(0, prompt)])  # [21, vocab] fp32
    reference = tiny_models.hf_logits(dense, prompt)
    assert (logits - reference).abs().max() < 0.1 * reference.abs().max()
    top5 = reference.topk(5, dim=-1).indices
    assert (top5 == logits.argmax(-1, keepdim=True)).any(-1).float().mean() >= 0.9


def test_the_engine_serves_an_fp8_checkpoint_in_bfloat16(folders, monkeypatch):
    """The one-call decode and the Python step loop give the same tokens under bf16 activations."""
    folder, _ = folders["ct-fp8-dynamic"]
    llm = LLM(folder, dtype="bfloat16", max_model_len=128)
    prompts = [{"prompt_token_ids": p} for p in ([5, 9, 23, 7], [11, 3, 40, 41, 42, 8, 19])]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    fused = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert llm.llm_engine.worker.runner.model.greedy_decoder() is not None
    monkeypatch.setenv("PAGEDCORE_GREEDY_DECODE", "0")
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == fused


def test_the_engine_serves_an_fp8_checkpoint(folders):
    folder, dense = folders["ct-fp8-dynamic"]
    prompt = [5, 9, 23, 7]
    (out,) = LLM(folder, max_model_len=128).generate([{"prompt_token_ids": prompt}],
                                                     SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    assert list(out.outputs[0].token_ids) == hf_greedy(dense, prompt, 6)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_pipeline_stages_keep_the_fp8_layers(folders, dtype):
    """Pipeline stages move whole layers, so each stage keeps its layers' e4m3 bytes and scales (tensor parallelism:
    tests/distributed/test_model_shard.py). The two stages chained in this process (the wire is the same
    IntermediateTensors) give the one-process model's logits bit for bit, under fp32 and bf16 activations."""
    from pagedcore.distributed.model_shard import load_model_shard
    from pagedcore.distributed.rank import ParallelLayout

    from ..distributed.shard_ranks import chained_stage_logits

    folder, _ = folders["ct-fp8-dynamic"]
    reference = load_model(folder, dtype=dtype, load_tokenizer=False)
    layout = ParallelLayout(pp_size=2)
    stages = [load_model_shard(folder, dtype, None, layout.rank_info(rank), None) for rank in range(2)]
    for stage in stages:
        assert stage.weight_format == "compressed-tensors" and stage.config.dtype == dtype
        for layer in stage.model.model.layers:
            assert [p.format.removesuffix("x16") for p in layer.mlp.down_proj.quant_parts] == ["fp8_e4m3"]
    assert [len(stage.model.model.layers) for stage in stages] == [2, 1]
    got, expected = chained_stage_logits(reference.model, stages, random_prompt(17, seed=3), 4)
    assert torch.equal(got, expected)
