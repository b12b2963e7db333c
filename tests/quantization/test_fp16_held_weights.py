"""The fp16 token table and lm_head of a GPTQ / AWQ checkpoint (their usual dtype) are held fp16, as stored,
under the model's fp32 activations: half an fp32 copy's bytes, read by kernels that widen each weight exactly
(cpp/kernels/linear.h kDenseF16 / kDenseF16x16) in the same order the fp32 kernels sum, so every logit equals
the fp32 copy's bit for bit, in either layout; lookups widen rows in C++ (embedding_rows), so the one-call
greedy decode runs on them."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from pagedcore import LLM, SamplingParams
from pagedcore.layers.linear import FP16_WEIGHTS_FP32_ACTIVATIONS, LINEAR_METHODS
from pagedcore.loader import load_model
from pagedcore.ops.dense_repack import X16Weight

from ..models.paged_driver import PagedDriver
from .gptq_awq_checkpoints import write_gptq_awq_folder
from .test_quantized_models import PROMPT


def _fp32_copy(folder, to):
    """The folder with its fp16 tensors (the table and head) stored as fp32: the same values."""
    copy = shutil.copytree(folder, to)
    path = copy / "model.safetensors"
    tensors = {name: t.float() if t.dtype is torch.float16 and not name.endswith("scales") else t
               for name, t in load_file(path).items()}
    save_file(tensors, str(path), metadata={"format": "pt"})
    return copy


@pytest.fixture(params=[("gptq", "llama"), ("gptq", "llama_tied"), ("awq", "qwen2")],
                ids=["gptq-untied", "gptq-tied", "awq-qwen2"])
def folders(request, tmp_path):
    method, kind = request.param
    write_gptq_awq_folder(tmp_path / "fp16", method, kind=kind, group_size=64, float_dtype=torch.float16)
    return kind, tmp_path / "fp16", _fp32_copy(tmp_path / "fp16", tmp_path / "fp32")


def test_fp16_tables_and_heads_are_held_fp16_and_give_the_fp32_copys_logits_bit_for_bit(folders):
    kind, fp16_folder, fp32_folder = folders
    loaded = load_model(str(fp16_folder), load_tokenizer=False)
    model = loaded.model
    embed = model.model.embed_tokens
    fp32_model = load_model(str(fp32_folder), load_tokenizer=False).model
    fp32_embed = fp32_model.model.embed_tokens
    assert embed.weight.dtype == torch.float16 and embed.dtype == torch.float32
    assert fp32_embed.weight.dtype == torch.float32
    ids = torch.tensor([3, 0, embed.vocab_size - 1, 3])
    rows = embed(ids)
    assert rows.dtype == torch.float32 and torch.equal(rows, fp32_embed(ids))  # widened exactly (C++ lookup)
    table_bytes = embed.weight.numel() * 2
    if kind == "llama_tied":
        assert model.lm_head is None and embed.head_kernel(torch.float32) is not None
        assert loaded.weight_bytes["float16"] == table_bytes
        assert (type(embed.weight) is X16Weight) == (type(fp32_embed.weight) is X16Weight)
    else:
        head = model.lm_head
        assert head.method is FP16_WEIGHTS_FP32_ACTIVATIONS and head.weight.dtype == torch.float16
        assert fp32_model.lm_head.method is LINEAR_METHODS["float32"]
        assert torch.equal(head.weight.data.float(), fp32_model.lm_head.weight.data)
        assert head.method.kernel_for(head, torch.float32) is not None
        assert loaded.weight_bytes["float16"] == table_bytes + head.weight.numel() * 2
        assert (type(head.weight) is X16Weight) == (type(fp32_model.lm_head.weight) is X16Weight)
        x = torch.randn(5, head.in_features)
        assert torch.equal(head(x), fp32_model.lm_head(x))  # the kernel: widened, the fp32 kernel's sums
        many_rows = head(torch.randn(70000, head.in_features))  # past the kernel's rows: torch widens W
        assert many_rows.dtype == torch.float32 and many_rows.shape == (70000, head.out_features)
    assert model.greedy_decoder() is not None, model.greedy_decode_reason
    ours, theirs = PagedDriver(model).step([(0, PROMPT)]), PagedDriver(fp32_model).step([(0, PROMPT)])
    assert torch.equal(ours, theirs)  # fp16 -> fp32 is exact and the kernels sum both in one order
    llm_tokens = []
    for folder in (fp16_folder, fp32_folder):  # the one-call decode (C++ lookup and head) on both
        (out,) = LLM(str(folder), max_model_len=128).generate([{"prompt_token_ids": PROMPT}],
                                                               SamplingParams(max_tokens=8, temperature=0.0))
        llm_tokens.append(out.outputs[0].token_ids)
    assert llm_tokens[0] == llm_tokens[1]


def test_a_biased_fp16_layer_is_held_with_its_fp32_bias(tmp_path):
    """A layer with a bias is held as stored too: the weight fp16, the bias fp32 as loaded (the kernels add an fp32
    bias); its output equals the fp32 layer's of the same values, bit for bit (the same sums, the same bias add)."""
    from pagedcore.layers.linear_quant import QuantPart, _become_dense
    from pagedcore.layers.linear import Linear
    from pagedcore.layers.linear_quant import QUANT_LINEAR_METHODS

    bias = torch.randn(48)
    weight = torch.randn(48, 32).half()
    layer = Linear(32, 48, bias=True, method=QUANT_LINEAR_METHODS["gptq"])
    layer.bias.data.copy_(bias)
    _become_dense(layer, QuantPart("float32", 0, 48, weight.float(), source_dtype=torch.float16))
    assert layer.method is FP16_WEIGHTS_FP32_ACTIVATIONS and layer.weight.dtype == torch.float16
    assert layer.bias.dtype == torch.float32 and torch.equal(layer.bias, bias)
    fp32 = Linear(32, 48, bias=True, method=LINEAR_METHODS["float32"])
    fp32.method.load(fp32, "weight", weight.float(), "weight", None)
    fp32.method.load(fp32, "bias", bias, "bias", None)
    fp32.method.process_weights_after_loading(fp32)
    x = torch.randn(5, 32)
    assert torch.equal(layer(x), fp32(x))
