"""StructuredOutputsParams validation, GrammarCache (compile, cache, errors), the bitmask stage
against a naive loop, and matcher cloning in RequestRegistry.fork."""

from __future__ import annotations

import pytest
import torch

from pagedcore.sampling.grammar_mask import apply_grammar_bitmask_
from pagedcore.sampling_params import SamplingParams
from pagedcore.sampling_params import StructuredOutputsParams as S
from pagedcore.structured_output.compiler import ConstraintError, GrammarCache, choice_grammar, new_matcher
from tests.models import tiny_models


@pytest.fixture(scope="module")
def cache():
    return GrammarCache(tiny_models.make_tokenizer(), tiny_models.VOCAB_SIZE, [2])


@pytest.mark.parametrize("kwargs,words", [
    ({}, "exactly one"), ({"regex": "a", "choice": ["a"]}, "got regex, choice"),
    ({"json": "{not json"}, "json is not valid JSON"), ({"json": "[1]"}, "JSON schema"),
    ({"regex": ""}, "non-empty string"), ({"choice": []}, "non-empty list"), ({"choice": ["a", 3]}, "non-empty list"),
    ({"grammar": 5}, "non-empty string"), ({"json_object": "yes"}, "True or False"),
    ({"regex": "a", "disable_any_whitespace": 1}, "True or False"),
])
def test_params_need_exactly_one_valid_constraint(kwargs, words):
    with pytest.raises(ValueError, match="StructuredOutputsParams") as refused:
        S(**kwargs)
    assert words in str(refused.value)


def test_params_key_is_stable_and_sampling_params_check_the_type():
    assert S(json={"b": 1, "a": 2}).key == S(json={"a": 2, "b": 1}).key
    assert S(choice=["x", "y"]).choice == ("x", "y") and S(choice=["x"]).kind == "choice"
    assert S(json_object=True, regex=None).kind == "json_object"
    with pytest.raises(ValueError, match="SamplingParams.structured_outputs"):
        SamplingParams(structured_outputs={"regex": "a"})
    child = SamplingParams(n=2, structured_outputs=S(regex="a")).child_params(1)
    assert child.structured_outputs == S(regex="a")


def test_cache_compiles_each_constraint_once(cache):
    first = cache.compile(S(regex="[ab]{2}"))
    assert cache.compile(S(regex="[ab]{2}")) is first
    assert cache.compile(S(regex="[ab]{3}")) is not first


@pytest.mark.parametrize("constraint,field,words", [
    (S(regex="(ab"), "regex", "parenthesis"),
    (S(json={"type": "objectx"}), "json", "objectx"),
    (S(grammar='root ::= "a" |'), "grammar", "EBNF"),
    (S(grammar='start ::= "a"'), "grammar", "root"),
])
def test_compile_errors_name_the_field_and_keep_the_compilers_words(cache, constraint, field, words):
    with pytest.raises(ConstraintError) as refused:
        cache.compile(constraint)
    error = refused.value
    assert error.field == field and isinstance(error, ValueError)
    assert str(error).startswith(f"structured_outputs.{field} could not be compiled: ")
    assert words in error.reason and ".cc:" not in error.reason     # no C++ source locations


def test_choice_grammar_escapes_quotes_and_newlines(cache):
    choices = ['say "hi"', "two\nlines", "back\\slash", "é"]
    grammar = cache.compile(S(choice=choices))
    for choice in choices:
        matcher = new_matcher(grammar)
        assert matcher.accept_string(choice) and matcher.is_completed(), choice
    assert not new_matcher(grammar).accept_string("say hi")
    assert choice_grammar(["a"]) == 'root ::= "a"'


@pytest.mark.parametrize("rows", [[0, 3, 4], [0, 1, 2, 3, 4], [2]])   # some rows (gather), every row (in place)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bitmask_stage_equals_a_naive_loop(rows, dtype):
    g = torch.Generator().manual_seed(0)
    num_rows, vocab = 5, 70                      # 70: the last int32 word is partly padding
    logits = torch.randn(num_rows, vocab, generator=g).to(dtype)
    bitmask = torch.randint(-2**31, 2**31 - 1, (num_rows, (vocab + 31) // 32), dtype=torch.int32, generator=g)
    expected = logits.clone()
    for r in rows:
        for t in range(vocab):
            if not (int(bitmask[r, t // 32]) >> (t % 32)) & 1:
                expected[r, t] = float("-inf")
    apply_grammar_bitmask_(logits, bitmask, rows)
    assert torch.equal(logits, expected)


def test_bitmask_stage_reads_only_the_rows_it_masks():
    # The step's bitmask buffer may have more rows than the step (grown by an earlier, larger step),
    # and unconstrained rows hold stale bits: neither may leak into the logits.
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 64, generator=g)
    bitmask = torch.zeros(6, 2, dtype=torch.int32)
    bitmask[1] = -1                               # row 1: everything allowed
    expected = logits.clone()
    expected[1] = logits[1]
    apply_grammar_bitmask_(logits, bitmask[:3], [1])
    assert torch.equal(logits, expected)
    apply_grammar_bitmask_(logits, bitmask[:3], [0])       # row 0: nothing allowed
    assert torch.isneginf(logits[0]).all() and torch.equal(logits[1:], expected[1:])


def test_the_accelerator_backend_agrees_with_the_cpu_kernel():
    # On a GPU the stage uses xgrammar's torch_native backend; check it on CPU tensors (no GPU here).
    import xgrammar as xgr

    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 100, generator=g)
    bitmask = torch.randint(-2**31, 2**31 - 1, (4, 4), dtype=torch.int32, generator=g)
    cpu, native = logits.clone(), logits.clone()
    apply_grammar_bitmask_(cpu, bitmask, [1, 2])
    xgr.apply_token_bitmask_inplace(native, bitmask, vocab_size=100, indices=[1, 2], backend="torch_native")
    assert torch.equal(cpu, native)


def test_an_early_fill_equals_a_fill_at_sample_time(cache):
    # The early fill (on a worker thread, before the forward) covers some of the step's rows, in its
    # own order; a row it did not see (an n > 1 child) is filled at sample time. The result must be
    # the bitmask a plain fill gives, row for row.
    from pagedcore.structured_output.bitmask import GrammarBitmask

    grammar = cache.compile(S(choice=["quick fox", "quick dog", "lazy dog"]))
    prefixes = ["", "quick ", "lazy", "quick f"]
    matchers = [new_matcher(grammar) for _ in prefixes]
    for matcher, prefix in zip(matchers, prefixes):
        assert matcher.accept_string(prefix) if prefix else True
    vocab = tiny_models.VOCAB_SIZE
    expected = GrammarBitmask(vocab, overlap=False).fill(5, [0, 1, 2, 4], matchers).clone()

    early = GrammarBitmask(vocab, overlap=True)
    early.start_early_fill([matchers[2], matchers[0], matchers[1]])   # matchers[3] not seen early
    got = early.fill(5, [0, 1, 2, 4], matchers)
    assert torch.equal(got[[0, 1, 2, 4]], expected[[0, 1, 2, 4]])
    # The common case: the early rows are exactly the step's rows, in order.
    early.start_early_fill(matchers)
    assert torch.equal(early.fill(4, [0, 1, 2, 3], matchers)[[0, 1, 2]], expected[[0, 1, 2]])
    # An early fill no sample took is dropped before its matchers move on.
    early.start_early_fill(matchers[:1])
    early.discard_early()
    assert matchers[0].accept_string("lazy")
    after = GrammarBitmask(vocab, overlap=False).fill(1, [0], matchers[:1])
    assert torch.equal(early.fill(1, [0], matchers[:1]), after)


def test_fork_clones_the_matcher_state(cache):
    from pagedcore.engine.request_registry import RequestRegistry
    from pagedcore.outputs import RequestMetrics

    tokenizer = tiny_models.make_tokenizer()
    registry = RequestRegistry(tokenizer)
    params = SamplingParams(structured_outputs=S(choice=["quick fox", "quick dog"]))
    grammar = cache.compile(params.structured_outputs)
    req = registry.new_request("r", None, [1, 5], params, RequestMetrics(arrival_time=0.0), grammar=grammar)
    registry.add(req)
    assert registry.num_constrained == 1
    parent = req.seqs[0]
    assert parent.grammar.accept_string("quick ")
    child = registry.fork(parent.seq_id)
    assert child.grammar is not parent.grammar
    assert child.grammar.accept_string("fox") and child.grammar.is_completed()
    assert not parent.grammar.is_completed() and parent.grammar.accept_string("dog")
    registry.finish("r")
    assert registry.num_constrained == 0
