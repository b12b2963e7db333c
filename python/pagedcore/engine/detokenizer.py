"""Token ids -> streamed text: `IncrementalDetokenizer` (one per sequence) and `StopStringChecker`.

The text of a sequence is the continuation of its prompt: the deltas concatenate to
decode(prompt + output)[len(decode(prompt)):], which for byte-level BPE is decode(output) and for
SentencePiece keeps the space that "▁" puts before the first generated word. A delta never ends in
half a UTF-8 character: byte-level BPE and byte-fallback split those over several tokens.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

REPLACEMENT_CHAR = "\ufffd"  # what a decoder prints for bytes that are not (yet) a whole character
# Prompt tokens kept as decoding context: enough for a decoder's leading-space rules, few enough
# that the first decode stays cheap. vLLM uses the same bounds.
_MIN_CONTEXT, _MAX_CONTEXT = 4, 24

try:  # tokenizers >= 0.21: the library's own incremental decoder (Rust)
    from tokenizers.decoders import DecodeStream
except ImportError:  # pragma: no cover - older tokenizers: the Python window decoder below
    DecodeStream = None


def _backend_of(tokenizer):
    """The Rust `tokenizers.Tokenizer` behind a tokenizer, or None (slow / SentencePiece backends)."""
    if type(tokenizer).__module__.startswith("tokenizers"):
        return tokenizer
    return getattr(tokenizer, "backend_tokenizer", None)


class IncrementalDetokenizer:
    """Decodes one sequence's output tokens as they arrive.

    Two offsets into `token_ids` (context + outputs) carry the state, as in vLLM's detokenizer:

        token_ids: [ ... context ... | emitted ... | unread ... ]
                                     ^prefix_offset ^read_offset
        delta = decode(token_ids[prefix_offset:])[len(decode(token_ids[prefix_offset:read_offset])):]

    held back while it ends in U+FFFD (a character still incomplete). With a Rust backend the same
    algorithm runs inside tokenizers' DecodeStream and we only mirror the offsets (for flush); if
    DecodeStream ever rejects a step we continue in Python from those offsets.
    """

    def __init__(self, tokenizer, prompt_token_ids: Sequence[int], skip_special_tokens: bool = True,
                 spaces_between_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._is_raw = type(tokenizer).__module__.startswith("tokenizers")
        context = self._prompt_context(list(prompt_token_ids))
        self.token_ids: list[int] = context  # context tail of the prompt, then every output token
        self.prefix_offset = 0
        self.read_offset = len(context)
        self.num_context_tokens = len(context)
        self.output_text = ""

        self._backend = _backend_of(tokenizer)
        self._stream = None
        if DecodeStream is not None and self._backend is not None:
            try:
                self._stream = DecodeStream(ids=context, skip_special_tokens=skip_special_tokens)
            except TypeError:  # tokenizers without the `ids` prefill: decode in Python instead
                self._stream = None

        # vLLM's rule: when special tokens are kept and spaces_between_special_tokens is False, a special
        # token that follows another one is emitted as its bare content, without a decoder's separator.
        self._added_tokens: dict[int, str] | None = None
        self._last_was_added = False
        if not (skip_special_tokens or spaces_between_special_tokens):
            self._added_tokens = self._added_token_contents() or None

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_context_tokens:]

    def add_tokens(self, new_token_ids: Sequence[int]) -> str:
        """Append tokens; return only the text they complete (possibly "")."""
        chunks = []
        for token_id in new_token_ids:
            self.token_ids.append(token_id)
            delta = self._step(token_id)
            if self._added_tokens is not None:
                content = self._added_tokens.get(token_id)
                if content is not None and self._last_was_added and delta is not None:
                    delta = content
                self._last_was_added = content is not None
            if delta is not None:
                self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
                chunks.append(delta)
        text = "".join(chunks)
        self.output_text += text
        return text

    def flush(self) -> str:
        """At the end of the sequence: the text still held back (an incomplete character shows as
        U+FFFD, exactly as a full decode would print it)."""
        if self.read_offset == len(self.token_ids):
            return ""
        delta = self._window_delta(hold_incomplete=False) or ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        self.output_text += delta
        return delta

    def fork(self) -> IncrementalDetokenizer:
        """An independent copy that continues from this point (a sequence forked mid-generation).

        The tokenizer is shared. A DecodeStream cannot be copied, so the copy opens its own on the
        emitted window and replays the held-back tokens (each held back again, as they were here);
        should that ever disagree, the copy decodes in Python from the mirrored offsets, which is exact."""
        clone = copy.copy(self)
        clone.token_ids = list(self.token_ids)
        clone._stream = None
        if self._stream is not None:
            try:
                stream = DecodeStream(ids=self.token_ids[self.prefix_offset:self.read_offset],
                                      skip_special_tokens=self.skip_special_tokens)
                if all(stream.step(self._backend, t) is None for t in self.token_ids[self.read_offset:]):
                    clone._stream = stream
            except Exception:  # noqa: BLE001 - DecodeStream raises plain Exception; Python takes over
                pass
        return clone

    def _step(self, token_id: int) -> str | None:
        if self._stream is not None:
            try:
                return self._stream.step(self._backend, token_id)
            except Exception:  # noqa: BLE001 - DecodeStream raises plain Exception on an invalid prefix
                self._stream = None  # the mirrored offsets let the Python decoder take over exactly here
        return self._window_delta(hold_incomplete=True)

    def _window_delta(self, hold_incomplete: bool) -> str | None:
        prefix_text = self._decode(self.token_ids[self.prefix_offset:self.read_offset])
        full_text = self._decode(self.token_ids[self.prefix_offset:])
        if len(full_text) <= len(prefix_text) or (hold_incomplete and full_text.endswith(REPLACEMENT_CHAR)):
            return None
        return full_text[len(prefix_text):]

    def _decode(self, ids: list[int]) -> str:
        if self._is_raw:
            return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)
        # No clean-up of tokenization spaces: DecodeStream does none either, and vLLM streams without it.
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens,
                                     clean_up_tokenization_spaces=False)

    def _prompt_context(self, prompt_token_ids: list[int]) -> list[int]:
        """The shortest prompt tail (>= 4 tokens) that starts on a character boundary, else the last 24."""
        if len(prompt_token_ids) <= _MIN_CONTEXT:
            return prompt_token_ids
        for n in range(_MIN_CONTEXT, min(len(prompt_token_ids), _MAX_CONTEXT) + 1):
            tail = prompt_token_ids[-n:]
            if not self._decode(tail).startswith(REPLACEMENT_CHAR):
                return tail
        return prompt_token_ids[-_MAX_CONTEXT:]

    def _added_token_contents(self) -> dict[int, str]:
        if self._is_raw:
            decoder = self.tokenizer.get_added_tokens_decoder()
        else:
            decoder = getattr(self.tokenizer, "added_tokens_decoder", {})
        return {token_id: getattr(token, "content", str(token)) for token_id, token in decoder.items()}


def make_token_decoder(tokenizer, skip_special_tokens: bool = False) -> Callable[[int], str]:
    """token id -> its text alone, cached: the `decoded_token` of a Logprob."""
    cache: dict[int, str] = {}

    def decode(token_id: int) -> str:
        text = cache.get(token_id)
        if text is None:
            text = cache[token_id] = tokenizer.decode([token_id], skip_special_tokens=skip_special_tokens)
        return text

    return decode


class StopStringChecker:
    """Cuts a streamed text at the first stop string, never showing a piece of one that is then cut.

    Feed it the detokenizer's deltas. It holds back the longest tail that could still grow into a
    stop string (at most max(len(stop)) - 1 characters; nothing when the stop string is to be
    included anyway). The first stop string to complete (the one that ends earliest in the text;
    of those ending together, the longest) ends the text, before it or after it.
    """

    def __init__(self, stop: Sequence[str] | str | None, include_stop_str_in_output: bool = False):
        self.stop = [stop] if isinstance(stop, str) else list(stop or [])
        if any(not s for s in self.stop):
            raise ValueError(f"stop strings must be non-empty, got {self.stop!r}")
        self.include_stop_str_in_output = include_stop_str_in_output
        self.max_stop_len = max(map(len, self.stop), default=0)
        self.text = ""  # everything seen, cut at the stop string once one matched
        self.num_released = 0  # text[:num_released] has been handed out
        self.stop_reason: str | None = None  # the stop string that matched

    @property
    def stopped(self) -> bool:
        return self.stop_reason is not None

    @property
    def num_held(self) -> int:
        return len(self.text) - self.num_released

    def fork(self) -> StopStringChecker:
        """An independent copy that continues from this point (its text and what it has released)."""
        clone = copy.copy(self)
        clone.stop = list(self.stop)
        return clone

    def feed(self, delta: str) -> str:
        """Add new text; return the part that is now safe to show."""
        if self.stopped or not delta:
            return ""
        old_len = len(self.text)
        self.text += delta
        match = self._first_match(old_len)
        if match is not None:
            start, stop = match
            self.text = self.text[: start + len(stop) if self.include_stop_str_in_output else start]
            self.stop_reason = stop
            return self._release(len(self.text))
        hold = 0 if self.include_stop_str_in_output else self._partial_stop_len()
        return self._release(len(self.text) - hold)

    def flush(self) -> str:
        """The held-back tail, when the sequence ends for another reason (EOS, length)."""
        return self._release(len(self.text))

    def _release(self, upto: int) -> str:
        released = self.text[self.num_released:upto]
        self.num_released = max(self.num_released, upto)
        return released

    def _first_match(self, old_len: int) -> tuple[int, str] | None:
        best = None  # (end, -len, start, stop)
        for stop in self.stop:
            # Earlier text had no match, so a new one must end inside the new text.
            start = self.text.find(stop, max(0, old_len - len(stop) + 1))
            if start >= 0:
                key = (start + len(stop), -len(stop), start, stop)
                if best is None or key < best:
                    best = key
        return None if best is None else (best[2], best[3])

    def _partial_stop_len(self) -> int:
        """Length of the longest unreleased tail that is a proper prefix of some stop string."""
        for n in range(min(self.max_stop_len - 1, len(self.text) - self.num_released), 0, -1):
            tail = self.text[-n:]
            if any(stop.startswith(tail) for stop in self.stop):
                return n
        return 0
