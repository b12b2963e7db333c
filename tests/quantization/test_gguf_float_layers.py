"""A GGUF's float matrices (F16 / BF16 / F32, whole layers: an F16 output or token_embd, a file that keeps some
layers unquantized, a fully F16 file) run as dense layers: held in the file's dtype under the model's fp32
activations (F16 / BF16: half an fp32 copy's bytes; the kernels widen each weight exactly), with kernels, the C++
decoder stack and the one-call greedy decode. They used to be float parts run by torch's F.linear in the Python
layer loop. The fp16 file's logits equal, bit for bit, those of the same values stored F32."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as T

from pagedcore import LLM, SamplingParams
from pagedcore.layers.linear import HELD_16BIT_METHODS, LINEAR_METHODS
from pagedcore.loader import load_model

from ..loader import tiny_gguf
from ..models import tiny_models
from ..models.paged_driver import PagedDriver
from ..models.test_decoder_stack import assert_stack_equals_loop
from ..models.test_llama_parity import random_prompt

FLOAT_LAYERS = ("blk.0.ffn_down.weight", "blk.1.attn_output.weight", "output.weight")


def _file(tmp_path, float_type: T, kind: str = "llama") -> str:
    """A Q4_1 file whose FLOAT_LAYERS (tied: and token_embd, not output) are stored as float_type; the model's
    values are rounded to fp16 first (F32 files then hold exactly the F16 file's values)."""
    types = {name: float_type for name in FLOAT_LAYERS if kind == "llama" or name != "output.weight"}
    if kind == "llama_tied":
        types["token_embd.weight"] = float_type
    model = tiny_models.build_hf_model(kind)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(param.half().float())
    return tiny_gguf.write_gguf(model, tmp_path / f"{kind}-{float_type.name}.gguf", T.Q4_1, "llama",
                                tensor_types=types, tokenizer=tiny_models.make_tokenizer())


@pytest.mark.parametrize("kind", ["llama", "llama_tied"])
def test_f16_layers_are_held_fp16_and_equal_the_f32_file_bit_for_bit(tmp_path, kind):
    f16 = load_model(_file(tmp_path, T.F16, kind), load_tokenizer=False)
    f32 = load_model(_file(tmp_path, T.F32, kind), load_tokenizer=False)
    layers = f16.model.model.layers
    held = [layers[0].mlp.down_proj, layers[1].self_attn.o_proj] + ([f16.model.lm_head] if kind == "llama" else [])
    for layer in held:
        assert layer.method is HELD_16BIT_METHODS[torch.float16] and layer.weight.dtype == torch.float16
    assert f32.model.model.layers[0].mlp.down_proj.method is LINEAR_METHODS["float32"]
    if kind == "llama_tied":
        embed = f16.model.model.embed_tokens
        assert embed.weight.dtype == torch.float16 and f16.model.lm_head is None
    assert f16.weight_bytes["float16"] > 0
    for loaded in (f16, f32):
        assert loaded.model.decoder_stack_status.supported, loaded.model.decoder_stack_status.reason
        assert loaded.model.greedy_decoder() is not None, loaded.model.greedy_decode_reason
    prompt = random_prompt(30, seed=3)
    ours = PagedDriver(f16.model, seed=1).greedy(0, prompt, 8, prefill_split=12)
    theirs = PagedDriver(f32.model, seed=1).greedy(0, prompt, 8, prefill_split=12)
    assert ours[0] == theirs[0] and torch.equal(ours[1], theirs[1])


@pytest.mark.parametrize("float_type", [T.F16, T.BF16])
def test_the_stack_runs_held_layers_as_the_layer_loop_does(tmp_path, float_type):
    model = load_model(_file(tmp_path, float_type), load_tokenizer=False).model
    assert model.decoder_stack_status.supported, model.decoder_stack_status.reason
    assert_stack_equals_loop(model, float_type.name)


def test_the_engine_serves_a_file_with_f16_layers(tmp_path):
    path = _file(tmp_path, T.F16, "llama_tied")
    llm = LLM(path, max_model_len=128)
    (out,) = llm.generate([{"prompt_token_ids": [5, 9, 23, 7]}], SamplingParams(max_tokens=6, temperature=0.0,
                                                                                 ignore_eos=True))
    assert len(out.outputs[0].token_ids) == 6
    assert llm.llm_engine.worker.runner.model.greedy_decoder() is not None
