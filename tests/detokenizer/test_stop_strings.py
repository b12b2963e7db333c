"""StopStringChecker: streamed text never shows a piece of a stop string that is then cut."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedcore.engine.detokenizer import IncrementalDetokenizer, StopStringChecker


def reference_cut(text: str, stops: list[str], include: bool):
    """The first stop string to complete, scanning the text one character at a time."""
    for end in range(1, len(text) + 1):
        matches = [s for s in stops if text[:end].endswith(s)]
        if matches:
            stop = max(matches, key=len)  # ending together: the longest started first
            return (text[:end] if include else text[:end - len(stop)]), stop
    return text, None


ALPHABET = "ab#\n"


@settings(max_examples=400, deadline=None)
@given(text=st.text(ALPHABET, max_size=40),
       stops=st.lists(st.text(ALPHABET, min_size=1, max_size=4), min_size=1, max_size=3),
       include=st.booleans(), cuts=st.lists(st.integers(0, 40), max_size=12))
def test_stream_matches_reference(text, stops, include, cuts):
    checker = StopStringChecker(stops, include)
    want_text, want_stop = reference_cut(text, stops, include)
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    shown = ""
    for start, end in zip(bounds, bounds[1:]):
        shown += checker.feed(text[start:end])
        assert want_text.startswith(shown)  # nothing shown is ever taken back
        assert checker.num_held <= (0 if include else max(map(len, stops)) - 1)
    shown += checker.flush()
    assert shown == want_text == checker.text
    assert checker.stop_reason == want_stop and checker.stopped == (want_stop is not None)
    if checker.stopped:
        assert checker.feed("more") == ""


def test_held_back_only_while_a_stop_string_could_start():
    checker = StopStringChecker(["###"])
    assert checker.feed("Answer: 4#") == "Answer: 4"
    assert checker.feed("#") == ""
    assert checker.feed(" ok") == "## ok"  # it was not "###" after all
    assert checker.feed("##") == ""
    assert checker.feed("#tail") == ""
    assert checker.stop_reason == "###" and checker.text == "Answer: 4## ok"


def test_earliest_ending_stop_wins_and_include():
    checker = StopStringChecker(["abc", "b"], include_stop_str_in_output=True)
    assert checker.feed("xabc") == "xab"
    assert checker.stop_reason == "b"
    assert StopStringChecker("\n", False).feed("line one\nline two") == "line one"


def test_no_stop_strings_is_a_passthrough():
    checker = StopStringChecker(None)
    assert checker.feed("anything ###") == "anything ###" and checker.num_held == 0 and not checker.stopped
    with pytest.raises(ValueError, match="non-empty"):
        StopStringChecker([""])


@pytest.mark.parametrize("text,stop,want", [
    ("x = 1 </answer> trailing", "</answer>", "x = 1 "),  # ' </' 'answer' '>'
    ("Result: done. STOP here and more", " STOP", "Result: done."),  # ' ST' 'OP'
    ("The answer is 42.\n###\nMore text", "42.\n#", "The answer is "),  # '4' '2' '.' '\n' '###'
])
def test_stop_string_spanning_tokens(smollm2_tokenizer, text, stop, want):
    tok = smollm2_tokenizer
    ids = tok.encode(text)
    assert not any(stop in tok.decode([i]) for i in ids)  # the stop string really spans tokens
    detok, checker = IncrementalDetokenizer(tok, tok.encode("Q: ")), StopStringChecker([stop])
    shown = []
    for token_id in ids:
        shown.append(checker.feed(detok.add_tokens([token_id])))
        if checker.stopped:
            break
    assert "".join(shown) == want and checker.stop_reason == stop
    assert not any(stop[:2] in chunk for chunk in shown)  # no piece of it ever reached the stream
