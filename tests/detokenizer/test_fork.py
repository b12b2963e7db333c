"""Forking mid-stream (beam search, n > 1 after the first token): a fork of an IncrementalDetokenizer
or a StopStringChecker continues exactly as the original would, and the two never share state."""

import random

import pytest

from pagedcore.engine import detokenizer as detokenizer_module
from pagedcore.engine.detokenizer import IncrementalDetokenizer, StopStringChecker

# Multi-byte characters split over several byte-level tokens: forks land inside held-back characters.
TEXTS = ["hello 世界 😀 and 👩‍💻 too", "naïve café 𝄞 résumé!", "<|im_end|> 日本語 🚀🚀 end"]


def full_stream(tok, prompt_ids, output_ids, skip):
    detok = IncrementalDetokenizer(tok, prompt_ids, skip_special_tokens=skip)
    return "".join(detok.add_tokens([t]) for t in output_ids) + detok.flush()


@pytest.mark.parametrize("which", ["smollm2_tokenizer", "sentencepiece_tokenizer"])
@pytest.mark.parametrize("skip", [True, False])
def test_a_fork_at_any_point_continues_like_the_original(which, skip, request):
    tok = request.getfixturevalue(which)
    prompt_ids = tok.encode("the fox", add_special_tokens=False)
    for text in TEXTS:
        output = tok.encode(text, add_special_tokens=False)
        want = full_stream(tok, prompt_ids, output, skip)
        for k in range(len(output) + 1):
            original = IncrementalDetokenizer(tok, prompt_ids, skip_special_tokens=skip)
            head = "".join(original.add_tokens([t]) for t in output[:k])
            fork = original.fork()
            assert fork.output_text == original.output_text and fork.output_token_ids == output[:k]
            # The fork goes first, so anything it shared with the original would show in the original.
            fork_tail = "".join(fork.add_tokens([t]) for t in output[k:]) + fork.flush()
            original_tail = "".join(original.add_tokens([t]) for t in output[k:]) + original.flush()
            assert head + fork_tail == head + original_tail == want, (text, k)
            assert fork.output_token_ids == original.output_token_ids == output


def test_forks_diverge_independently(smollm2_tokenizer):
    tok = smollm2_tokenizer
    prompt_ids = tok.encode("hi")
    shared = tok.encode(" a") + tok.encode("😀")[:1]             # ends inside a held-back character
    a_ids, b_ids = shared + tok.encode("😀")[1:] + tok.encode(" cat"), shared + tok.encode(" 世界 dog")
    split = len(shared)
    a = IncrementalDetokenizer(tok, prompt_ids)
    a.add_tokens(a_ids[:split])
    b = a.fork()
    a.add_tokens(a_ids[split:])
    b.add_tokens(b_ids[split:])
    assert a.output_text + a.flush() == tok.decode(a_ids)
    assert b.output_text + b.flush() == tok.decode(b_ids)


def test_a_fork_keeps_the_rust_decode_stream(smollm2_tokenizer):
    """The fast path survives a fork, held-back bytes included (the stream is rebuilt and replayed)."""
    if detokenizer_module.DecodeStream is None:
        pytest.skip("this tokenizers has no DecodeStream")
    tok = smollm2_tokenizer
    ids = tok.encode("ok 😀")
    detok = IncrementalDetokenizer(tok, [])
    detok.add_tokens(ids[:-1])                                  # the emoji's last byte still to come
    assert detok.read_offset < len(detok.token_ids)
    fork = detok.fork()
    assert fork._stream is not None and fork._stream is not detok._stream
    assert fork.add_tokens(ids[-1:]) == detok.add_tokens(ids[-1:]) == " 😀"


def test_a_fork_decodes_in_python_when_the_original_does(monkeypatch, sentencepiece_tokenizer):
    monkeypatch.setattr(detokenizer_module, "DecodeStream", None)
    tok = sentencepiece_tokenizer
    rnd = random.Random(1)
    output = tok.encode("the quick brown fox 日本語", add_special_tokens=False)
    want = full_stream(tok, [], output, True)
    for _ in range(20):
        k = rnd.randrange(len(output) + 1)
        original = IncrementalDetokenizer(tok, [])
        head = original.add_tokens(output[:k])
        fork = original.fork()
        assert fork._stream is None
        assert head + fork.add_tokens(output[k:]) + fork.flush() == want


@pytest.mark.parametrize("include", [False, True])
def test_stop_checker_fork_continues_and_is_independent(include):
    deltas = ["Hel", "lo, wo", "rld! S", "TOP here"]
    want = StopStringChecker(["STOP", "xyz"], include)
    want_text = "".join(want.feed(d) for d in deltas) + want.flush()
    for k in range(len(deltas) + 1):
        original = StopStringChecker(["STOP", "xyz"], include)
        head = "".join(original.feed(d) for d in deltas[:k])
        fork = original.fork()
        fork_tail = "".join(fork.feed(d) for d in deltas[k:]) + fork.flush()
        original_tail = "".join(original.feed(d) for d in deltas[k:]) + original.flush()
        assert head + fork_tail == head + original_tail == want_text
        assert fork.stop_reason == original.stop_reason == "STOP"
    # Diverging after the fork: one stops, the other never sees the stop string.
    a = StopStringChecker(["STOP"], include)
    a.feed("abc ST")
    b = a.fork()
    # Without include, "ST" is held back (it may start "STOP"); with it, it was released already.
    assert a.feed("OP") == ("OP" if include else "") and a.stopped
    assert b.feed("ILL going") == ("ILL going" if include else "STILL going") and not b.stopped
