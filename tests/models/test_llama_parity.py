"""pagedcore's Llama family against HF transformers on tiny random models, fp32, through the paged
cache: logits within 1e-4 and greedy tokens identical, for plain, chunked and mixed batches."""

from __future__ import annotations

import pytest
import torch

from pagedcore.loader import load_model

from .paged_driver import PagedDriver
from .tiny_models import TINY_KINDS, VOCAB_SIZE, build_hf_model, hf_logits, save_hf_folder

ATOL = 1e-4
NUM_GENERATED = 32


def random_prompt(length: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB_SIZE, (length,), generator=generator).tolist()


def assert_greedy_matches_hf(hf_model, prompt, tokens, step_logits):
    """Teacher-forced HF logits over prompt + our tokens: each of our steps must match HF's logits at
    that position and pick HF's argmax, hence HF greedy decoding yields exactly our tokens."""
    reference = hf_logits(hf_model, prompt + tokens[:-1])[len(prompt) - 1:]  # [NUM_GENERATED, vocab]
    torch.testing.assert_close(step_logits, reference, atol=ATOL, rtol=0)
    assert tokens == reference.argmax(-1).tolist()


@pytest.mark.parametrize("kind", sorted(TINY_KINDS))
def test_greedy_decode_matches_hf(tiny_model_factory, kind):
    hf_model, folder = tiny_model_factory(kind)
    loaded = load_model(folder)
    prompt = random_prompt(21, seed=1)
    tokens, step_logits = PagedDriver(loaded.model).greedy(0, prompt, NUM_GENERATED)
    assert_greedy_matches_hf(hf_model, prompt, tokens, step_logits)


def test_hf_generate_gives_the_same_tokens(tiny_model_factory):
    hf_model, folder = tiny_model_factory("llama")
    prompt = random_prompt(21, seed=1)
    tokens, _ = PagedDriver(load_model(folder).model).greedy(0, prompt, NUM_GENERATED)
    with torch.no_grad():
        output = hf_model.generate(torch.tensor([prompt]), max_new_tokens=NUM_GENERATED, do_sample=False,
                                   eos_token_id=None, pad_token_id=0)
    hf_tokens = output[0, len(prompt):].tolist()
    assert tokens[:len(hf_tokens)] == hf_tokens and len(hf_tokens) == NUM_GENERATED


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("split", [5, 16])  # mid-block, and exactly one full block
def test_chunked_prefill_matches_hf(tiny_model_factory, kind, split):
    hf_model, folder = tiny_model_factory(kind)
    prompt = random_prompt(37, seed=2)
    tokens, step_logits = PagedDriver(load_model(folder).model, seed=3).greedy(
        0, prompt, NUM_GENERATED, prefill_split=split)
    assert_greedy_matches_hf(hf_model, prompt, tokens, step_logits)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_mixed_batch_of_prefill_and_decode_matches_hf(tiny_model_factory, kind):
    """Sequence A decodes while B prefills in one forward (plus padding rows); then both decode."""
    hf_model, folder = tiny_model_factory(kind)
    driver = PagedDriver(load_model(folder).model, seed=4)
    prompt_a, prompt_b = random_prompt(23, seed=5), random_prompt(9, seed=6)
    token_a = int(driver.step([(0, prompt_a)])[-1].argmax())

    logits = driver.step([(0, [token_a]), (1, prompt_b)], num_padding=3)  # [1 + 9, vocab]
    torch.testing.assert_close(logits[0], hf_logits(hf_model, prompt_a + [token_a])[-1], atol=ATOL, rtol=0)
    torch.testing.assert_close(logits[1:], hf_logits(hf_model, prompt_b), atol=ATOL, rtol=0)

    token_a2, token_b = int(logits[0].argmax()), int(logits[-1].argmax())
    logits = driver.step([(1, [token_b]), (0, [token_a2])])  # order swapped: rows follow the batch
    torch.testing.assert_close(logits[0], hf_logits(hf_model, prompt_b + [token_b])[-1], atol=ATOL, rtol=0)
    torch.testing.assert_close(logits[1], hf_logits(hf_model, prompt_a + [token_a, token_a2])[-1],
                               atol=ATOL, rtol=0)


def test_two_prefills_of_different_lengths_in_one_forward(tiny_model_factory):
    hf_model, folder = tiny_model_factory("mistral")
    driver = PagedDriver(load_model(folder).model, seed=7)
    prompt_a, prompt_b = random_prompt(30, seed=8), random_prompt(3, seed=9)
    logits = driver.step([(0, prompt_a), (1, prompt_b)])  # [33, vocab]: every prompt position
    torch.testing.assert_close(logits[:30], hf_logits(hf_model, prompt_a), atol=ATOL, rtol=0)
    torch.testing.assert_close(logits[30:], hf_logits(hf_model, prompt_b), atol=ATOL, rtol=0)


def test_sharded_checkpoint_loads_the_same_model(tmp_path):
    hf_model = build_hf_model("llama", seed=11)
    folder = save_hf_folder(hf_model, tmp_path, max_shard_size="200KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 2
    prompt = random_prompt(21, seed=12)
    tokens, step_logits = PagedDriver(load_model(folder).model).greedy(0, prompt, NUM_GENERATED)
    assert_greedy_matches_hf(hf_model, prompt, tokens, step_logits)


@pytest.mark.parametrize("max_rows", [None, "8"])
def test_bfloat16_stays_close_to_fp32_hf(tiny_model_factory, monkeypatch, max_rows):
    """bf16 drifts (as in any engine); it must stay near fp32 HF and keep its top token in HF's top 5.
    By default the 21 rows run the C++ decoder stack; with max_rows 8 the layer loop with torch's
    GEMM (widened to fp32 where the CPU's bf16 GEMM is slow, pagedcore.ops.linear.torch_linear)."""
    if max_rows is not None:
        monkeypatch.setenv("PAGEDCORE_LINEAR_MAX_ROWS", max_rows)
    hf_model, folder = tiny_model_factory("llama")
    loaded = load_model(folder, dtype="bfloat16")
    assert loaded.model.model.embed_tokens.weight.dtype == torch.bfloat16
    driver = PagedDriver(loaded.model)
    assert driver.kv_cache.dtype == torch.bfloat16
    prompt = random_prompt(21, seed=1)
    logits = driver.step([(0, prompt)])  # [21, vocab] fp32
    reference = hf_logits(hf_model, prompt)
    assert (logits - reference).abs().max() < 0.1 * reference.abs().max()
    top5 = reference.topk(5, dim=-1).indices
    assert (top5 == logits.argmax(-1, keepdim=True)).any(-1).float().mean() >= 0.9


def test_loaded_config_describes_the_model(tiny_model_factory):
    _, folder = tiny_model_factory("qwen3")
    loaded = load_model(folder)
    config = loaded.config
    assert (config.architecture, config.head_dim, config.num_kv_heads) == ("Qwen3ForCausalLM", 32, 2)
    assert config.qk_norm and not config.attention_bias and config.eos_token_ids == (2,)
    assert loaded.source.format == "hf" and loaded.tokenizer is not None
    assert loaded.chat_template and loaded.generation_config.get("eos_token_id") == 2
    assert load_model(tiny_model_factory("qwen2")[1]).config.attention_bias
    assert load_model(tiny_model_factory("llama")[1]).config.rope_scaling["rope_type"] == "llama3"
