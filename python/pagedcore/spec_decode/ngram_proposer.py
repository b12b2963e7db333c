"""Prompt-lookup (n-gram) drafts: continue the sequence the way its own history continued before.

The suffix of the token history (its last n tokens, prompt_lookup_min <= n <= prompt_lookup_max) is
looked up earlier in the history; the tokens that followed the match are the drafts:

    history:  ... a b c x y z ... a b c | ?      suffix "a b c" (n = 3) matched at j
                      ^ j          ^^^^^ suffix
    drafts:   x y z ...  (up to K tokens after the match)

The longest matching n wins, then the latest match (the most recent context). All of it is numpy
over the whole history: one compare per n-gram length, never a loop over tokens.
"""

from __future__ import annotations

import numpy as np


def propose_ngram(history: np.ndarray, num_tokens: int, min_n: int, max_n: int) -> np.ndarray:
    """history int64 [L] (prompt + output) -> drafts int64 [<= num_tokens] (empty: no match)."""
    length = history.shape[0]
    if length < min_n + 1 or num_tokens <= 0:
        return history[:0]
    # Candidate end positions j (< L - 1) whose token equals the last one: a match of length >= 1.
    ends = np.flatnonzero(history[:-1] == history[-1])          # [C]
    if ends.size == 0:
        return history[:0]
    match_len = np.ones(ends.shape[0], dtype=np.int64)           # [C] matched suffix length so far
    alive = np.ones(ends.shape[0], dtype=bool)                   # [C] still matching at this depth
    for m in range(1, min(max_n, length - 1)):
        # depth m compares history[j - m] with history[L - 1 - m]; j - m < 0 ends the match
        pos = ends - m                                           # [C]
        ok = alive & (pos >= 0)
        ok[ok] = history[pos[ok]] == history[length - 1 - m]
        match_len += ok
        alive = ok
        if not alive.any():
            break
    best = match_len.max()
    if best < min_n:
        return history[:0]
    j = ends[np.flatnonzero(match_len == best)[-1]]              # the latest of the longest matches
    return history[j + 1:j + 1 + num_tokens]
