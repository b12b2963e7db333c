"""draft_model and layer_skip with temperature > 0, and their start-up checks.

- Rejection sampling with a draft distribution q (accept min(1, p/q), else the residual (p - q)+):
  emitted tokens follow p, chi-square over many seeded draws, with a negative control.
- Through the engine: the token verified against a draft-model (or layer-skip) draft follows the
  target's marginal (the method of test_engine_sampling.py), and seeded requests repeat alone and in
  a crowd.
- Start-up refusals: vocabulary mismatch (size, tokenizer), num_layers out of range, LoRA with
  layer_skip; vLLM's older spelling {"model": PATH} is draft_model.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from pagedcore import LLM, SamplingParams
from pagedcore.config import EngineConfig
from pagedcore.sampling_params import SamplingParams as SP
from pagedcore.spec_decode import SpeculativeConfig
from pagedcore.spec_decode.rejection_sampler import accept_random, target_probs
from tests.models import tiny_models

from .stats_util import chi_square_p
from .test_engine_sampling import PROMPT
from .test_rejection_sampler import reference_probs


def _no_residual(probs, drafts, generator, draft_probs):
    """A wrong sampler: accepts with min(1, p/q) but on rejection redraws from p, not (p - q)+."""
    if torch.rand(1, generator=generator) < probs[0, drafts[0]] / draft_probs[0, drafts[0]]:
        return np.array([drafts[0]])
    return np.array([int(torch.multinomial(probs[0], 1, generator=generator))])


def _draws(p, q, k, num, seed, sampler=accept_random):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(num):
        drafts = np.array([int(torch.multinomial(q[i], 1, generator=g)) for i in range(k)])
        out.append(sampler(p, drafts, g, q[:k]).tolist())
    return out


def test_emitted_tokens_follow_p_whatever_q():
    vocab = 20
    g = torch.Generator().manual_seed(4)
    p = target_probs(torch.randn(3, vocab, generator=g) * 1.5, [SP(temperature=1.0)] * 3)    # [3, V]
    q = target_probs(torch.randn(2, vocab, generator=g) * 1.5, [SP(temperature=1.0)] * 2)    # [2, V]
    samples = _draws(p, q, 2, 20000, seed=1)
    first = np.bincount([s[0] for s in samples], minlength=vocab)
    assert chi_square_p(first, p[0].double().numpy()) > 1e-3
    second = np.bincount([s[1] for s in samples if len(s) > 1], minlength=vocab)
    assert second.sum() > 1000 and chi_square_p(second, p[1].double().numpy()) > 1e-3
    # Negative control: the test tells a sampler that skips the residual apart.
    biased = np.bincount([s[0] for s in _draws(p, q, 1, 20000, seed=2, sampler=_no_residual)], minlength=vocab)
    assert chi_square_p(biased, p[0].double().numpy()) < 1e-6
    # With q the acceptance is min(1, p/q) >= p(d), the n-gram (point-mass) rule's: q pays.
    accepted_q = np.mean([len(s) > 1 for s in _draws(p, q, 1, 4000, seed=6)])
    accepted_point = np.mean([len(s) > 1 for s in _draws(p, q, 1, 4000, seed=6,
                                                         sampler=lambda p_, d, g, q_: accept_random(p_, d, g))])
    assert accepted_q > accepted_point + 0.05


def test_q_equal_to_p_always_accepts():
    p = target_probs(torch.randn(3, 30, generator=torch.Generator().manual_seed(5)), [SP(temperature=0.7)] * 3)
    samples = _draws(p, p[:2].clone(), 2, 500, seed=3)
    assert all(len(s) == 3 for s in samples)


def _specs(draft_folders):
    always = {"disable_by_batch_size": None, "backoff_after_misses": 0, "num_speculative_tokens": 1}
    return {"draft_model": {"method": "draft_model", "model": draft_folders["noisy"], **always},
            "layer_skip": {"method": "layer_skip", "num_layers": 1, **always}}


@pytest.mark.parametrize("method,params", [
    ("draft_model", SamplingParams(temperature=1.0, top_p=0.9, top_k=40, max_tokens=3, ignore_eos=True)),
    ("layer_skip", SamplingParams(temperature=0.8, max_tokens=3, ignore_eos=True)),
])
def test_verified_token_follows_the_target_marginal(tiny_llama, draft_folders, method, params):
    hf_model, folder = tiny_llama
    vocab = tiny_models.VOCAB_SIZE
    with torch.no_grad():
        p1 = reference_probs(hf_model(torch.tensor([PROMPT])).logits[0, -1], params)         # [V]
        logits2 = hf_model(torch.tensor([PROMPT + [t] for t in range(vocab)])).logits[:, -1]  # [V, V]
    p2_given = torch.stack([reference_probs(logits2[t], params) for t in range(vocab)])     # [V, V]
    marginal = (p1.unsqueeze(1) * p2_given).sum(0)                                           # [V]
    llm = LLM(folder, max_model_len=64, speculative_config=_specs(draft_folders)[method])
    n = 2000
    outs = llm.generate([{"prompt_token_ids": PROMPT}] * n,
                        [dataclasses.replace(params, seed=i) for i in range(n)], use_tqdm=False)
    spec = llm.llm_engine.speculator.stats
    assert spec.num_drafts == n                                   # every request verified one draft
    assert 0.05 * n < spec.num_accepted_tokens < 0.95 * n          # accept and residual paths both ran
    first = np.bincount([o.outputs[0].token_ids[0] for o in outs], minlength=vocab)
    second = np.bincount([o.outputs[0].token_ids[1] for o in outs], minlength=vocab)
    assert chi_square_p(first, p1.numpy()) > 1e-3
    assert chi_square_p(second, marginal.numpy()) > 1e-3


@pytest.mark.parametrize("method", ["draft_model", "layer_skip"])
def test_seeded_requests_repeat_alone_and_in_a_crowd(tiny_llama, draft_folders, method):
    _, folder = tiny_llama
    spec = {**_specs(draft_folders)[method], "num_speculative_tokens": 3}
    llm = LLM(folder, max_model_len=128, speculative_config=spec)
    params = SamplingParams(temperature=0.9, seed=1234, max_tokens=30, ignore_eos=True)
    alone = llm.generate({"prompt_token_ids": PROMPT}, params, use_tqdm=False)[0].outputs[0].token_ids
    crowd = llm.generate([{"prompt_token_ids": PROMPT}] + [{"prompt_token_ids": PROMPT[:5 + i]} for i in range(12)],
                         [params] + [SamplingParams(temperature=1.0, max_tokens=30, ignore_eos=True)] * 12,
                         use_tqdm=False)
    assert crowd[0].outputs[0].token_ids == alone
    assert llm.llm_engine.speculator.stats.num_draft_tokens > 0


def test_older_spelling_and_method_fields():
    assert SpeculativeConfig.from_value({"model": "/some/draft", "num_speculative_tokens": 3}).method == "draft_model"
    cfg = SpeculativeConfig.from_value({"model": "[ngram]", "num_speculative_tokens": 3})
    assert cfg.method == "ngram" and cfg.model is None
    assert EngineConfig(speculative_config={"method": "layer_skip", "num_layers": 2}).speculative_config.num_layers == 2


def _save_other_vocab(folder, vocab_size: int, tokenizer_text: str | None = None) -> str:
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    config = transformers.LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=256)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(folder, safe_serialization=True)
    if tokenizer_text is None:
        tiny_models.make_tokenizer().save_pretrained(folder)
    else:   # same size class, other tokens
        backend = Tokenizer(models.BPE())
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.train_from_iterator([tokenizer_text], trainers.BpeTrainer(
            vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
        transformers.PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                             unk_token="<unk>").save_pretrained(folder)
    return str(folder)


def test_vocabulary_mismatch_is_refused_at_start_up(tiny_llama, tmp_path):
    _, folder = tiny_llama
    small = _save_other_vocab(tmp_path / "v300", 300)
    with pytest.raises(ValueError, match=r"vocabulary of 300 tokens, the target 512"):
        LLM(folder, max_model_len=64, speculative_config={"method": "draft_model", "model": small})
    other = _save_other_vocab(tmp_path / "v512", tiny_models.VOCAB_SIZE,
                              "Pack my box with five dozen liquor jugs! " * 4)
    with pytest.raises(ValueError, match="does not share the target's vocabulary: their tokenizers differ"):
        LLM(folder, max_model_len=64, speculative_config={"method": "draft_model", "model": other})


def test_layer_skip_refusals(tiny_llama):
    _, folder = tiny_llama
    with pytest.raises(ValueError, match=r"num_layers \(3\) must be below the target's 3 layers"):
        LLM(folder, max_model_len=64, speculative_config={"method": "layer_skip", "num_layers": 3})
    with pytest.raises(ValueError, match='"layer_skip" does not run with LoRA'):
        LLM(folder, max_model_len=64, enable_lora=True, speculative_config={"method": "layer_skip", "num_layers": 1})


@pytest.mark.parametrize("method", ["draft_model", "layer_skip"])
def test_parallelism_is_refused_for_draft_methods(method):
    """Tensor / pipeline parallelism (worker ranks): draft methods are refused before anything loads."""
    from pagedcore.spec_decode.draft_setup import build_draft

    spec = {"method": method, **({"model": "/unused"} if method == "draft_model" else {"num_layers": 1})}
    config = EngineConfig(speculative_config=spec, tensor_parallel_size=2)
    with pytest.raises(ValueError, match="runs with the model in the engine's process only"):
        build_draft(config, None, None, in_process=False)
    with pytest.raises(ValueError, match="does not run with tensor_parallel_size > 1"):
        build_draft(config, None, None, in_process=True)
    assert build_draft(EngineConfig(speculative_config={"method": "ngram"}, tensor_parallel_size=2),
                       None, None, in_process=False) is None


@pytest.mark.parametrize("preemption_mode", ["recompute", "swap"])
def test_sampling_with_a_draft_model_survives_preemption(tiny_llama, draft_folders, preemption_mode):
    """Drafts drawn from q, then the sequence preempted before its verification: q is kept until
    the drafts are verified (after the recompute or swap-in); nothing leaks."""
    from .test_greedy_parity import check_clean
    from tests.engine.conftest import prompts_with_shared_prefix

    _, folder = tiny_llama
    spec = {"method": "draft_model", "model": draft_folders["noisy"], "num_speculative_tokens": 4,
            "disable_by_batch_size": None, "backoff_after_misses": 0}
    llm = LLM(folder, max_model_len=256, block_size=16, num_gpu_blocks_override=14, max_num_batched_tokens=64,
              preemption_mode=preemption_mode, swap_space="64MiB", speculative_config=spec)
    prompts = [p + p[-12:] for p in prompts_with_shared_prefix(8, seed=5)]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        [SamplingParams(temperature=0.8, seed=i, max_tokens=40, ignore_eos=True) for i in range(8)],
                        use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 40 for o in outs)
    stats = check_clean(llm)
    assert stats.num_preemptions > 0 and llm.llm_engine.speculator.stats.num_accepted_tokens > 0
