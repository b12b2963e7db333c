"""IncrementalDetokenizer: deltas concatenate to the continuation of the prompt, and no delta ends
in half a character. Byte-level BPE (SmolLM2) and SentencePiece-style (Llama 2 layout) tokenizers."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedcore.engine import detokenizer as detokenizer_module
from pagedcore.engine.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer, make_token_decoder

# Multi-byte characters of every UTF-8 length, CJK, emoji (4 bytes, and a ZWJ sequence).
CHARS = ["a", "Z", " ", "\n", "é", "ü", "Ω", "中", "世", "界", "語", "😀", "🚀", "𝄞", "👩‍💻", "!", "12"]
SMOL_SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
SMOL_PROMPTS = ["", "hi there", "<|im_start|>user\nhello 世界<|im_end|>\n<|im_start|>assistant\n", "日本 😀"]
HYPOTHESIS = settings(max_examples=150, deadline=None)


def stream(tokenizer, prompt_ids, output_ids, chunks, skip_special_tokens=True, spaces=True):
    """Feed output_ids in chunks of the given sizes; return (deltas, flushed tail)."""
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens, spaces)
    deltas, position = [], 0
    for size in chunks:
        if position >= len(output_ids):
            break
        deltas.append(detok.add_tokens(output_ids[position:position + size]))
        position += size
    if position < len(output_ids):
        deltas.append(detok.add_tokens(output_ids[position:]))
    tail = detok.flush()
    assert detok.output_text == "".join(deltas) + tail
    assert detok.output_token_ids == list(output_ids)
    return deltas, tail


def continuation(tokenizer, prompt_ids, output_ids, skip):
    full = tokenizer.decode(prompt_ids + output_ids, skip_special_tokens=skip)
    prefix = tokenizer.decode(prompt_ids, skip_special_tokens=skip)
    assert full.startswith(prefix)
    return full[len(prefix):]


chunk_sizes = st.lists(st.integers(1, 4), min_size=0, max_size=30)


@HYPOTHESIS
@given(data=st.data(), prompt=st.sampled_from(SMOL_PROMPTS), skip=st.booleans(), chunks=chunk_sizes)
def test_byte_level_random_ids(smollm2_tokenizer, data, prompt, skip, chunks):
    """Any id sequence, invalid UTF-8 included: the text equals decode(output)."""
    tok = smollm2_tokenizer
    output = data.draw(st.lists(st.integers(0, len(tok) - 1), min_size=1, max_size=20))
    prompt_ids = tok.encode(prompt)
    deltas, tail = stream(tok, prompt_ids, output, chunks, skip)
    want = tok.decode(output, skip_special_tokens=skip)
    assert "".join(deltas) + tail == want == continuation(tok, prompt_ids, output, skip)
    if REPLACEMENT_CHAR not in want:
        assert tail == "" and all(REPLACEMENT_CHAR not in d for d in deltas)


@HYPOTHESIS
@given(pieces=st.lists(st.sampled_from(CHARS + SMOL_SPECIALS + [" hello", " world"]), min_size=1, max_size=12),
       prompt=st.sampled_from(SMOL_PROMPTS), skip=st.booleans(), chunks=chunk_sizes)
def test_byte_level_text_round_trips(smollm2_tokenizer, pieces, prompt, skip, chunks):
    tok = smollm2_tokenizer
    text = "".join(pieces)
    output = tok.encode(text)
    deltas, tail = stream(tok, tok.encode(prompt), output, chunks, skip)
    assert tail == "" and all(REPLACEMENT_CHAR not in d for d in deltas)  # whole characters only
    assert "".join(deltas) == tok.decode(output, skip_special_tokens=skip)
    if not skip:
        assert "".join(deltas) == text


def sentencepiece_units(tok):
    """Token sequences that decode to valid UTF-8: whole vocabulary pieces, specials, and each
    character's bytes as byte-fallback tokens (<0x..>) so characters split across tokens."""
    vocab = tok.get_vocab()
    pieces = sorted(i for t, i in vocab.items() if not t.startswith("<0x") and t not in ("<unk>",))
    byte_id = {b: vocab[f"<0x{b:02X}>"] for b in range(256)}
    piece = st.sampled_from(pieces).map(lambda i: [i])
    char = st.sampled_from(CHARS).map(lambda c: [byte_id[b] for b in c.encode()])
    return st.lists(st.one_of(piece, char), min_size=1, max_size=10).map(lambda units: sum(units, []))


@HYPOTHESIS
@given(data=st.data(), prompt=st.sampled_from(["", "hi there", "the fox", "日本", "<s>"]), skip=st.booleans(),
       chunks=chunk_sizes)
def test_sentencepiece_continues_the_prompt(sentencepiece_tokenizer, data, prompt, skip, chunks):
    tok = sentencepiece_tokenizer
    output = data.draw(sentencepiece_units(tok))
    prompt_ids = tok.encode(prompt, add_special_tokens=False)
    deltas, tail = stream(tok, prompt_ids, output, chunks, skip)
    assert tail == "" and all(REPLACEMENT_CHAR not in d for d in deltas)
    assert "".join(deltas) == continuation(tok, prompt_ids, output, skip)
    if not prompt or (prompt == "<s>" and skip):
        assert "".join(deltas) == tok.decode(output, skip_special_tokens=skip)


def test_sentencepiece_space_before_first_generated_word(sentencepiece_tokenizer):
    tok = sentencepiece_tokenizer
    the, fox = tok.convert_tokens_to_ids(["▁the", "▁fox"])
    after_prompt, _ = stream(tok, tok.encode("hello world", add_special_tokens=False), [the, fox], [1, 1])
    assert after_prompt == [" the", " fox"]  # "hello world" + " the fox"
    from_nothing, _ = stream(tok, [], [the, fox], [1, 1])
    assert from_nothing == ["the", " fox"]  # a text's first "▁" is no space, as decode() has it
    after_bos, _ = stream(tok, [tok.bos_token_id], [the, fox], [1, 1])
    assert after_bos == ["the", " fox"]


@pytest.mark.parametrize("which", ["smollm2_tokenizer", "sentencepiece_tokenizer"])
def test_emoji_appears_only_when_complete(which, request):
    tok = request.getfixturevalue(which)
    ids = tok.encode("😀", add_special_tokens=False)
    if which == "sentencepiece_tokenizer":
        ids = [i for i in ids if tok.convert_ids_to_tokens(i) != "▁"]
    assert len(ids) >= 2  # really split over tokens
    deltas, tail = stream(tok, [], ids, [1] * len(ids))
    assert deltas[:-1] == [""] * (len(ids) - 1) and deltas[-1].strip() == "😀" and tail == ""


def test_flush_gives_the_incomplete_tail_as_decode_prints_it(smollm2_tokenizer):
    tok = smollm2_tokenizer
    ids = tok.encode("a😀")
    detok = IncrementalDetokenizer(tok, [])
    assert detok.add_tokens(ids[:-1]) == "a"
    assert detok.flush() == tok.decode(ids[:-1])[1:] == REPLACEMENT_CHAR
    assert detok.flush() == ""


def test_python_decoder_when_decode_stream_is_missing(monkeypatch, smollm2_tokenizer, sentencepiece_tokenizer):
    monkeypatch.setattr(detokenizer_module, "DecodeStream", None)
    rnd = random.Random(0)
    for tok, prompt in [(smollm2_tokenizer, "hi there"), (sentencepiece_tokenizer, "the fox")]:
        for _ in range(150):
            output = [rnd.randrange(len(tok)) for _ in range(rnd.randrange(1, 12))]
            prompt_ids = tok.encode(prompt, add_special_tokens=False)
            if tok is sentencepiece_tokenizer:  # valid UTF-8 only (see the hypothesis test)
                output = [i for i in output if not tok.convert_ids_to_tokens(i).startswith("<0x")] or [5]
            skip = rnd.random() < 0.5
            deltas, tail = stream(tok, prompt_ids, output, [rnd.randrange(1, 4) for _ in range(12)], skip)
            assert "".join(deltas) + tail == continuation(tok, prompt_ids, output, skip)


def test_decode_stream_failure_hands_over_to_python(monkeypatch, smollm2_tokenizer):
    real = detokenizer_module.DecodeStream

    class FlakyStream:
        def __init__(self, **kwargs):
            self.inner, self.steps = real(**kwargs), 0

        def step(self, tokenizer, token_id):
            self.steps += 1
            if self.steps == 4:
                raise Exception("Invalid prefix encountered")
            return self.inner.step(tokenizer, token_id)

    monkeypatch.setattr(detokenizer_module, "DecodeStream", FlakyStream)
    tok = smollm2_tokenizer
    output = tok.encode(" 世界 is 😀 ok, 日本語 too")
    deltas, tail = stream(tok, tok.encode("hi"), output, [1] * len(output))
    assert "".join(deltas) + tail == tok.decode(output)


def test_spaces_between_special_tokens(wordpiece_tokenizer):
    """A decoder that joins tokens with spaces (WordPiece): with spaces_between_special_tokens=False,
    a special token right after another one comes without the separator (vLLM's rule)."""
    cls, sep, hello, world = (wordpiece_tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]", "hello", "world"))
    ids = [cls, sep, hello, world, sep, sep]
    with_spaces, _ = stream(wordpiece_tokenizer, [], ids, [1] * 6, skip_special_tokens=False, spaces=True)
    assert "".join(with_spaces) == wordpiece_tokenizer.decode(ids, skip_special_tokens=False)
    without, _ = stream(wordpiece_tokenizer, [], ids, [1] * 6, skip_special_tokens=False, spaces=False)
    assert "".join(without) == "[CLS][SEP] hello world [SEP][SEP]"
    skipped, _ = stream(wordpiece_tokenizer, [], ids, [1] * 6, skip_special_tokens=True, spaces=False)
    assert "".join(skipped) == "hello world"


def test_make_token_decoder(smollm2_tokenizer):
    decode = make_token_decoder(smollm2_tokenizer)
    hello = smollm2_tokenizer.encode("Hello")[0]
    assert decode(hello) == "Hello" and decode(hello) == "Hello"
    assert decode(smollm2_tokenizer.eos_token_id) == smollm2_tokenizer.eos_token
