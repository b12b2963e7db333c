"""An HF checkpoint stored bf16 or fp16, run in float32 (dtype auto on an HF folder): every linear (a bias fp32)
and the token table are held in the checkpoint's dtype (layers/held_weights.py hold_16bit_enabled; half the bytes of
the fp32 copy the model used to make), and the kernels widen each weight exactly, so the model computes the
same thing as with the values widened at load (PAGEDCORE_HOLD_16BIT=0): bit for bit for fp16 in either layout
and for bf16 in the x16 layouts (AVX512-BF16 CPUs); within fp32 rounding for bf16's row layout (AVX2), whose
kernel sums pairs in another order. Greedy tokens equal HF transformers' fp32 run of the same weights."""

from __future__ import annotations

import pytest
import torch

from pagedcore import LLM, SamplingParams
from pagedcore.layers.linear import HELD_16BIT_METHODS, LINEAR_METHODS
from pagedcore.loader import load_model
from pagedcore.ops.dense_repack import X16Weight

from ..engine.conftest import hf_greedy
from .paged_driver import PagedDriver
from .test_decoder_stack import assert_stack_equals_loop
from .test_llama_parity import random_prompt
from . import tiny_models


def _folder(tmp_path, kind: str, dtype: torch.dtype):
    """(HF transformers' fp32 model of the folder, the folder of `kind` stored in `dtype`). The reference is
    loaded from the folder: a model converted in memory (.to(dtype).float()) would keep its rotary inv_freq
    rounded to dtype, which the checkpoint does not store."""
    import transformers

    model = tiny_models.build_hf_model(kind).to(dtype)
    folder = tiny_models.save_hf_folder(model, tmp_path / f"{kind}-{dtype}".replace("torch.", ""))
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval(), folder


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("kind", ["llama", "llama_tied", "qwen2"])
def test_a_16bit_checkpoint_is_held_as_stored_and_computes_the_same(tmp_path, monkeypatch, kind, dtype):
    hf_model, folder = _folder(tmp_path, kind, dtype)
    held = load_model(folder, load_tokenizer=False)
    assert held.config.dtype == "float32"
    layer = held.model.model.layers[0]
    for linear in (layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
        assert linear.method is HELD_16BIT_METHODS[dtype] and linear.weight.dtype == dtype
    qkv = layer.self_attn.qkv_proj
    assert qkv.method is HELD_16BIT_METHODS[dtype]
    if kind == "qwen2":  # q/k/v biases: held too, the bias fp32 (added in fp32, as by the fp32 layer)
        assert qkv.weight.dtype == dtype and qkv.bias.dtype == torch.float32
    assert held.model.model.embed_tokens.weight.dtype == dtype
    assert held.weight_bytes[str(dtype).removeprefix("torch.")] > held.weight_bytes.get("float32", 0)
    assert held.model.decoder_stack_status.supported, held.model.decoder_stack_status.reason
    assert held.model.greedy_decoder() is not None, held.model.greedy_decode_reason

    monkeypatch.setenv("PAGEDCORE_HOLD_16BIT", "0")
    widened = load_model(folder, load_tokenizer=False)
    assert widened.model.model.layers[0].mlp.down_proj.weight.dtype == torch.float32
    prompt = random_prompt(30, seed=3)
    ours = PagedDriver(held.model, seed=1).greedy(0, prompt, 8, prefill_split=12)
    theirs = PagedDriver(widened.model, seed=1).greedy(0, prompt, 8, prefill_split=12)
    same_order = dtype is torch.float16 or type(layer.mlp.down_proj.weight) is X16Weight
    if same_order:
        assert torch.equal(ours[1], theirs[1])
    else:
        assert (ours[1] - theirs[1]).abs().max() <= 1e-5 * theirs[1].abs().max()
    assert ours[0] == hf_greedy(hf_model, prompt, 8)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_the_stack_runs_held_layers_as_the_layer_loop_does(tmp_path, dtype):
    _, folder = _folder(tmp_path, "llama", dtype)
    assert_stack_equals_loop(load_model(folder, load_tokenizer=False).model, str(dtype))


def test_a_reload_of_other_values_widens_the_layer_back_losslessly(tmp_path):
    _, folder = _folder(tmp_path, "llama", torch.bfloat16)
    model = load_model(folder, load_tokenizer=False).model
    down = model.model.layers[0].mlp.down_proj
    values = torch.randn(down.out_features, down.in_features)  # not bf16-representable
    down.load_weight("weight", values, "down_proj.weight")
    assert down.method is LINEAR_METHODS["float32"] and torch.equal(down.weight.data, values)
    embed = model.model.embed_tokens
    table = torch.randn(embed.vocab_size, embed.hidden_size)
    embed.load_weight("weight", table, "embed_tokens.weight")
    assert embed.weight.dtype == torch.float32 and torch.equal(embed(torch.tensor([3, 1])), table[[3, 1]])


def test_the_engine_serves_it_and_the_switch_turns_it_off(tmp_path, monkeypatch):
    _, folder = _folder(tmp_path, "llama_tied", torch.bfloat16)
    outs = []
    for hold in ("1", "0"):
        monkeypatch.setenv("PAGEDCORE_HOLD_16BIT", hold)
        (out,) = LLM(folder, max_model_len=128).generate([{"prompt_token_ids": [5, 9, 23, 7]}],
                                                         SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
        outs.append(out.outputs[0].token_ids)
    assert outs[0] == outs[1] and len(outs[0]) == 6
    monkeypatch.setenv("PAGEDCORE_HOLD_16BIT", "2")
    with pytest.raises(ValueError, match="PAGEDCORE_HOLD_16BIT"):
        load_model(folder, load_tokenizer=False)


@pytest.mark.parametrize("kind", ["llama", "llama_tied"])
def test_a_model_bound_for_a_gpu_widens_its_held_weights(tmp_path, kind):
    """Before a move to a GPU (engine/worker.py, distributed/rank_worker.py) the held weights become fp32: the
    GPU's GEMMs take one dtype. The same values, so the same model (the CPU kernels now sum the fp32 rows in
    their row order: within fp32 rounding of the held x16 sums)."""
    from pagedcore.layers.held_weights import widen_held_weights
    from pagedcore.layers.linear import Linear

    _, folder = _folder(tmp_path, kind, torch.float16)
    model = load_model(folder, load_tokenizer=False).model
    prompt = random_prompt(20, seed=4)
    before = PagedDriver(model, seed=1).greedy(0, prompt, 6)
    assert widen_held_weights(model) > 0
    for module in model.modules():
        if isinstance(module, Linear):
            assert module.method is LINEAR_METHODS["float32"] and module.weight.dtype == torch.float32
    assert model.model.embed_tokens.weight.dtype == torch.float32
    assert widen_held_weights(model) == 0
    after = PagedDriver(model, seed=1).greedy(0, prompt, 6)
    assert after[0] == before[0] and (after[1] - before[1]).abs().max() <= 1e-5 * before[1].abs().max()
