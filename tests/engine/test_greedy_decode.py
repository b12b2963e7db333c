"""The one-call step (models/greedy_decode.py, cpp/kernels/greedy_decode.h), greedy or plainly sampled,
against the Python forward + sampling it stands in for: the same kernels on the same rows (and for
seeded sampled rows the same noise), so every token is the same,
for every weight format the stack runs (dense fp32 / bf16 x16 or checkpoint layout, GGUF blocks
repacked or as stored, k-quants, int8 per channel; tied and untied heads), through chunked prefill,
prefix-cache hits and batches with logprobs requests (the same logprobs) and penalised / biased /
min_tokens rows (logit_edits.h). Bad indices are
refused before the KV cache is written; a model whose head has no single kernel declines with a reason."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

from pagedcore import LLM, SamplingParams
from pagedcore.engine.step_input import StepInput
from pagedcore.models import greedy_decode
from pagedcore.sampling.logit_edits import LogitEdits
from pagedcore.sampling.logprobs import RawLogitRows
from pagedcore.sampling.row_sampling import RowSampling
from tests.engine.conftest import hf_greedy, prompts_with_shared_prefix
from tests.models import tiny_models
from tests.quantization import quant_models

ENGINE = dict(kv_cache_memory="16MiB", max_model_len=256, max_num_batched_tokens=32)  # chunked prefill


def _hf_folder(tmp_path, kind):
    folder = tmp_path / kind
    tiny_models.build_hf_model(kind).save_pretrained(folder)
    tiny_models.make_tokenizer().save_pretrained(folder)
    return str(folder)


# name -> (model path builder, LLM options, environment)
MODELS = {
    "fp32 untied": (lambda tmp: _hf_folder(tmp, "llama"), {"dtype": "float32"}, {}),
    "fp32 untied, checkpoint layout": (lambda tmp: _hf_folder(tmp, "llama"), {"dtype": "float32"},
                                       {"PAGEDCORE_DENSE_REPACK": "0"}),
    "bf16 tied": (lambda tmp: _hf_folder(tmp, "llama_tied"), {"dtype": "bfloat16"}, {}),
    "q4_1, q8_0 head": (lambda tmp: quant_models.write_block_gguf(tmp / "m.gguf", "llama", T.Q4_1,
                                                                  {"output.weight": T.Q8_0}), {}, {}),
    "q4_1 as stored (file layout)": (lambda tmp: quant_models.write_block_gguf(tmp / "m.gguf", "llama", T.Q4_1,
                                                                               {"output.weight": T.Q8_0}),
                                     {}, {"PAGEDCORE_QUANT_REPACK": "0"}),
    "q4_0 tied q8_0 table": (lambda tmp: quant_models.write_block_gguf(tmp / "m.gguf", "llama_tied", T.Q4_0,
                                                                       {"token_embd.weight": T.Q8_0}), {}, {}),
    "k-quants": (lambda tmp: quant_models.write_kquant_gguf(tmp / "k.gguf", quant_models.KQUANT_UNIFORM_TYPES),
                 {}, {}),
    "int8_per_channel": (lambda tmp: _hf_folder(tmp, "llama"), {"quantization": "int8_per_channel"}, {}),
}


class _Counter:
    """Counts GreedyDecode calls (the path ran) without changing them."""

    def __init__(self, monkeypatch):
        self.calls = self.edited_calls = self.logprob_calls = 0
        original = greedy_decode.GreedyDecode.__call__

        def counted(decoder, step, kv_cache, sampling=None, edits=None, raw=None):
            self.calls += 1
            self.edited_calls += edits is not None
            self.logprob_calls += raw is not None
            return original(decoder, step, kv_cache, sampling, edits, raw)
        monkeypatch.setattr(greedy_decode.GreedyDecode, "__call__", counted)


def _generate(llm, prompts, params):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def _generate_with_logprobs(llm, prompts, params):
    """(token ids, per position [(token id, logprob, rank), ...] or None) of each prompt's output."""
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    result = []
    for o in outs:
        c = o.outputs[0]
        positions = None if c.logprobs is None else [
            [(token_id, lp.logprob, lp.rank) for token_id, lp in entry.items()] for entry in c.logprobs]
        result.append((c.token_ids, positions))
    return result


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_one_call_step_gives_the_python_paths_tokens(tmp_path, monkeypatch, name):
    build, options, env = MODELS[name]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    path = build(tmp_path)
    prompts = prompts_with_shared_prefix(5, seed=2)  # 5..90 tokens, shared prefixes: cache hits
    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    # Seeded sampled rows of every kind beside a greedy one (seeds: the same noise on both paths).
    sampled_params = [SamplingParams(temperature=0.9, max_tokens=10, ignore_eos=True, seed=11),
                      SamplingParams(temperature=0.7, top_p=0.8, max_tokens=10, ignore_eos=True, seed=12),
                      SamplingParams(temperature=1.3, top_k=5, max_tokens=10, ignore_eos=True, seed=13),
                      SamplingParams(temperature=1.0, min_p=0.2, top_k=40, top_p=0.95, max_tokens=10,
                                     ignore_eos=True, seed=14),
                      greedy]
    counter = _Counter(monkeypatch)
    llm = LLM(path, **options, **ENGINE)
    model = llm.llm_engine.worker.runner.model
    fused = _generate(llm, prompts, greedy)
    assert model.greedy_decoder() is not None, model.greedy_decode_reason
    assert counter.calls > 0
    calls_before = counter.calls
    sampled = _generate(llm, prompts, sampled_params)
    assert counter.calls > calls_before
    # Requests asking for logprobs (one also penalised and sampled) beside the seeded rows: the one
    # call copies their raw rows out and the engine computes the logprobs as the Sampler does.
    mixed_params = sampled_params[:3] + [
        SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0.9, seed=31, logprobs=3, repetition_penalty=1.2, max_tokens=6, ignore_eos=True)]
    calls_before = counter.calls
    mixed = _generate_with_logprobs(llm, prompts, mixed_params)
    assert counter.calls > calls_before and counter.logprob_calls > 0
    assert mixed[3][1] is not None and len(mixed[3][1]) == 4 and mixed[4][1] is not None
    # Rows with logit edits (penalties, logit_bias, min_tokens), greedy and seeded: the one call too.
    calls_before = counter.calls
    edited = _generate(llm, prompts, EDITED_PARAMS)
    assert counter.calls > calls_before and counter.edited_calls > 0
    monkeypatch.setenv("PAGEDCORE_GREEDY_DECODE", "0")
    calls_before = counter.calls
    python = _generate(llm, prompts, greedy)
    python_sampled = _generate(llm, prompts, sampled_params)
    python_mixed = _generate_with_logprobs(llm, prompts, mixed_params)
    python_edited = _generate(llm, prompts, EDITED_PARAMS)
    assert counter.calls == calls_before and model.greedy_decoder() is None
    assert fused == python
    assert sampled == python_sampled
    assert mixed == python_mixed
    assert edited == python_edited
    assert sampled[:4] != [python[0]] * 4  # the sampled rows did sample (not all the greedy tokens)
    assert edited[2] == [5] * 10  # the +100 bias held every step
    assert edited[0] != python[0] or edited[4] != python[4]  # the penalties changed greedy tokens


# Greedy and seeded rows with each logit edit (row 2's bias forces token 5; row 3 bans EOS for 6 tokens).
EDITED_PARAMS = [
    SamplingParams(temperature=0, repetition_penalty=1.5, max_tokens=10, ignore_eos=True),
    SamplingParams(temperature=0.8, presence_penalty=0.5, frequency_penalty=0.7, max_tokens=10, ignore_eos=True,
                   seed=21),
    SamplingParams(temperature=0, logit_bias={5: 100.0, 7: -100.0}, max_tokens=10, ignore_eos=True),
    SamplingParams(temperature=0.9, top_p=0.9, min_tokens=6, max_tokens=10, seed=22, stop_token_ids=[3, 4]),
    SamplingParams(temperature=0, repetition_penalty=0.7, frequency_penalty=-0.4, presence_penalty=0.3,
                   max_tokens=10, ignore_eos=True),
]


def test_the_one_call_step_equals_hf_greedy(tiny_llama, monkeypatch):
    hf_model, folder = tiny_llama
    counter = _Counter(monkeypatch)
    llm = LLM(folder, dtype="float32", **ENGINE)
    prompts = prompts_with_shared_prefix(4, seed=7)
    got = _generate(llm, prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    assert counter.calls > 0
    assert got == [hf_greedy(hf_model, p, 12) for p in prompts]


def test_a_head_without_a_single_kernel_declines_and_the_python_path_runs(tmp_path, monkeypatch):
    # An F16 output tensor in a quantized file is a dense fp16 head with a kernel; without its binding (as a
    # head of several formats, or one a library GEMM runs, has none) the one-call decode declines.
    from pagedcore.layers.linear import DenseLinearMethod

    path = quant_models.write_block_gguf(tmp_path / "m.gguf", "llama", T.Q4_1, {"output.weight": T.F16})
    monkeypatch.setattr(DenseLinearMethod, "kernel_for", lambda self, layer, x_dtype: None)
    counter = _Counter(monkeypatch)
    llm = LLM(path, **ENGINE)
    model = llm.llm_engine.worker.runner.model
    tokens = _generate(llm, [[5, 9, 23, 7]], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    assert model.greedy_decoder() is None and "LM head" in model.greedy_decode_reason
    assert counter.calls == 0 and len(tokens[0]) == 6


def test_the_decoder_is_bound_again_when_a_weight_is_replaced(tiny_llama, monkeypatch):
    llm = LLM(tiny_llama[1], dtype="float32", **ENGINE)
    model = llm.llm_engine.worker.runner.model
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    before = _generate(llm, [[5, 9, 23, 7, 41]], params)
    first = model.greedy_decoder()
    norm = model.model.norm.weight
    norm.data = norm.data.clone()  # new memory, same values
    second = model.greedy_decoder()
    assert second is not None and second is not first
    assert second.tensors[2].data_ptr() == norm.data_ptr()
    assert _generate(llm, [[5, 9, 23, 7, 41]], params) == before


def _one_token_step(position: int, token: int, slot: int, logits_row: int = 0) -> StepInput:
    empty = np.zeros((0, 2), dtype=np.int32)
    return StepInput(input_ids=np.array([token], dtype=np.int64), positions=np.array([position], dtype=np.int64),
                     slot_mapping=np.array([slot], dtype=np.int64), block_tables=np.array([[0]], dtype=np.int32),
                     seq_lens=np.array([position + 1], dtype=np.int32),
                     query_start_loc=np.array([0, 1], dtype=np.int32),
                     logits_indices=np.array([logits_row], dtype=np.int64), blocks_to_swap_out=empty,
                     blocks_to_swap_in=empty, blocks_to_copy=empty, num_tokens=1, max_query_len=1,
                     max_seq_len=position + 1)


def test_bad_indices_are_refused_before_the_cache_is_written(tiny_llama):
    llm = LLM(tiny_llama[1], dtype="float32", **ENGINE)
    runner = llm.llm_engine.worker.runner
    decoder = runner.model.greedy_decoder()
    kv_cache = runner.kv_cache
    kv_cache[:, :, 0].fill_(0.25)  # block 0: what a refused step must leave as it was
    before = kv_cache[:, :, 0].clone()
    max_position = decoder.tensors[1].shape[0]
    cases = [  # (step, exception, words in the message)
        (_one_token_step(max_position, 5, 0), IndexError, "rotary table"),
        (_one_token_step(0, tiny_models.VOCAB_SIZE, 0), IndexError, "vocabulary"),
        (_one_token_step(0, -1, 0), IndexError, "vocabulary"),
        (_one_token_step(0, 5, 0, logits_row=1), IndexError, "logits row"),
        (_one_token_step(0, 5, 10 ** 9), IndexError, "slot_mapping"),  # past the cache: the stack checks it
    ]
    for step, error, words in cases:
        with pytest.raises(error, match=words):
            decoder(step, kv_cache)
        assert torch.equal(kv_cache[:, :, 0], before)
    wrong_dtype = _one_token_step(0, 5, 0)
    wrong_dtype.input_ids = wrong_dtype.input_ids.astype(np.float64)  # an unsafe cast: refused, not rounded
    with pytest.raises(TypeError):
        decoder(wrong_dtype, kv_cache)
    wrong_length = _one_token_step(0, 5, 0)
    wrong_length.positions = np.array([0, 1], dtype=np.int64)
    with pytest.raises(ValueError, match="positions must be 1-D of 1 entries"):
        decoder(wrong_length, kv_cache)
    assert torch.equal(kv_cache[:, :, 0], before)
    # Sampling inputs are checked before the layers run, too.
    good = RowSampling.from_params([SamplingParams(temperature=0.8)], None, decoder.vocab_size)
    for field, value, words in [("temperature", -1.0, "temperature"), ("top_p", 0.0, "top_p"),
                                ("min_p", 2.0, "min_p"), ("top_k", 0, "top_k")]:
        bad = dataclasses.replace(good, **{field: np.array([value], dtype=getattr(good, field).dtype)})
        with pytest.raises(ValueError, match=words):
            decoder(_one_token_step(0, 5, 0), kv_cache, bad)
        assert torch.equal(kv_cache[:, :, 0], before)
    two_rows = RowSampling.from_params([SamplingParams(temperature=1)] * 2, None, decoder.vocab_size)
    assert decoder.takes(1, 1, kv_cache, good) and not decoder.takes(1, 1, kv_cache, two_rows)  # declined up front
    with pytest.raises(ValueError, match="sampling inputs for 2 rows"):
        decoder(_one_token_step(0, 5, 0), kv_cache, RowSampling.from_params([SamplingParams(temperature=1)] * 2,
                                                                           None, decoder.vocab_size))
    assert torch.equal(kv_cache[:, :, 0], before)
    # So are logit edits (greedy and sampled steps alike).
    penalised = SamplingParams(repetition_penalty=1.3, logit_bias={3: 2.0})

    def edits_of(num_rows):
        return LogitEdits.from_requests([penalised] * num_rows, vocab_size=decoder.vocab_size, eos_token_ids=(),
                                        prompt_token_ids=[[1, 2]] * num_rows, output_token_ids=[[4]] * num_rows,
                                        num_output_tokens=[1] * num_rows)
    edits = edits_of(1)
    for bad, words in [(dataclasses.replace(edits, bias_tokens=np.array([decoder.vocab_size], dtype=np.int32)),
                        "vocabulary"),
                       (dataclasses.replace(edits, repetition_penalty=np.array([-1.0], dtype=np.float32)),
                        "repetition_penalty")]:
        for sampling in (None, good):
            with pytest.raises((ValueError, IndexError), match=words):
                decoder(_one_token_step(0, 5, 0), kv_cache, sampling, bad)
            assert torch.equal(kv_cache[:, :, 0], before)
    two_row_edits = edits_of(2)
    assert decoder.takes(1, 1, kv_cache, None, edits) and not decoder.takes(1, 1, kv_cache, None, two_row_edits)
    # And raw rows for logprobs: inside the step's rows, an output of the vocabulary's width.
    bad_raw = RawLogitRows(np.array([1], dtype=np.int64), torch.empty(1, decoder.vocab_size))
    with pytest.raises(IndexError, match="raw logits row 1"):
        decoder(_one_token_step(0, 5, 0), kv_cache, None, None, bad_raw)
    with pytest.raises(ValueError, match="columns"):
        decoder(_one_token_step(0, 5, 0), kv_cache, None, None,
                RawLogitRows(np.array([0], dtype=np.int64), torch.empty(1, decoder.vocab_size - 1)))
    assert torch.equal(kv_cache[:, :, 0], before)
    assert not decoder.takes(1, 1, kv_cache, None, None,
                             RawLogitRows(np.array([0], dtype=np.int64), torch.empty(1, decoder.vocab_size - 1)))
    raw = RawLogitRows.of([0], decoder.vocab_size)
    assert decoder(_one_token_step(0, 5, 0), kv_cache, None, edits, raw).shape == (1,)
    assert torch.isfinite(raw.out).all()  # the head's row, copied out
    # A valid step through the same decoder still works (the errors left nothing behind).
    assert decoder(_one_token_step(0, 5, 0), kv_cache).shape == (1,)
    assert decoder(_one_token_step(0, 5, 0), kv_cache, good).shape == (1,)


def test_step_probe_splits_the_one_call_step(tiny_llama, monkeypatch):
    """bench throughput's StepProbe: a fused step's layers count as model forward, its head as lm_head."""
    from pagedcore.benchmarks.probe import StepProbe

    counter = _Counter(monkeypatch)
    llm = LLM(tiny_llama[1], dtype="float32", **ENGINE)
    engine = llm.llm_engine
    _generate(llm, [[5, 9, 23]], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))  # builds it
    with StepProbe(engine) as probe:
        engine.add_request("p", prompt_token_ids=[5, 9, 23, 7], params=SamplingParams(temperature=0, max_tokens=6,
                                                                                        ignore_eos=True))
        while engine.has_unfinished_requests():
            engine.step()
        records = probe.take()
    assert counter.calls >= 6
    decode = [r for r in records if r["num_prefill_tokens"] == 0]
    assert decode and all(r["model_forward"] > 0 and r["lm_head"] > 0 for r in decode)
    assert all(r["model_forward"] + r["lm_head"] <= r["forward"] + 1e-6 for r in decode)


def test_more_sampled_rows_than_a_checkpoint_layout_head_takes_fall_back(tmp_path, monkeypatch):
    """Quantized layers (a stack that takes any step) under a dense F32 tied table in the checkpoint layout
    (CPUs without the x16 repack, e.g. the AVX2 machines): the head runs its kernel up to max_rows rows and
    a library GEMM past them, so steps sampling more rows must take the Python path."""
    monkeypatch.setenv("PAGEDCORE_DENSE_REPACK", "0")
    path = quant_models.write_block_gguf(tmp_path / "m.gguf", "llama_tied", T.Q4_1, {"token_embd.weight": T.F32})
    llm = LLM(path, kv_cache_memory="64MiB", max_model_len=64, max_num_batched_tokens=2048)
    runner = llm.llm_engine.worker.runner
    decoder = runner.model.greedy_decoder()
    assert decoder is not None, runner.model.greedy_decode_reason
    assert decoder.head_max_rows < decoder.max_rows   # the stack takes more rows than the head's kernel
    rows = decoder.head_max_rows + 4
    assert not decoder.takes(rows, rows, runner.kv_cache) and decoder.takes(rows, rows - 4, runner.kv_cache)
    counter = _Counter(monkeypatch)
    prompts = [[3 + i % 400, 7, 11 + i % 50] for i in range(rows)]
    # Half the requests stop after 2 tokens: the later steps sample half the rows, which the head takes.
    params = [SamplingParams(temperature=0, max_tokens=2 + 4 * (i % 2), ignore_eos=True) for i in range(rows)]
    got = _generate(llm, prompts, params)
    assert counter.calls > 0
    monkeypatch.setenv("PAGEDCORE_GREEDY_DECODE", "0")
    assert got == _generate(llm, prompts, params)
