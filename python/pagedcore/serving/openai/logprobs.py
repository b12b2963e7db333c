"""The engine's per-position logprob dicts in OpenAI's two shapes: completions (parallel lists with
text offsets) and chat (one entry per token with its top alternatives and UTF-8 bytes)."""

from __future__ import annotations

from collections.abc import Sequence

from pagedcore.outputs import Logprob

# JSON has no -inf; OpenAI clients expect a number. vLLM clamps to the same value.
_FLOOR = -9999.0


def _value(logprob: float) -> float:
    return max(logprob, _FLOOR)


def _token_text(token_id: int, lp: Logprob, tokenizer) -> str:
    if lp.decoded_token is not None:
        return lp.decoded_token
    return tokenizer.decode([token_id]) if tokenizer is not None else ""


def _top(position: dict[int, Logprob], num: int) -> list[tuple[int, Logprob]]:
    """The `num` best candidates of one position (the sampled token is in the dict even when it is not
    among them; it then stays out, as OpenAI's top_logprobs does)."""
    ranked = sorted(position.items(), key=lambda kv: (kv[1].rank if kv[1].rank is not None else 1 << 30,
                                                      -kv[1].logprob))
    return ranked[:num]


class CompletionLogprobs:
    """Builds `choices[i].logprobs` of /v1/completions; keeps the running text offset across chunks."""

    def __init__(self, num_top: int, tokenizer, text_offset: int = 0):
        self.num_top = num_top
        self.tokenizer = tokenizer
        self.offset = text_offset

    def build(self, token_ids: Sequence[int], positions: Sequence[dict[int, Logprob] | None]) -> dict:
        tokens, token_logprobs, top_logprobs, text_offset = [], [], [], []
        for token_id, position in zip(token_ids, positions):
            if position is None:                       # the first prompt token: nothing predicts it
                text = self.tokenizer.decode([token_id])
                token_logprobs.append(None)
                top_logprobs.append(None)
            else:
                lp = position.get(token_id)
                text = _token_text(token_id, lp, self.tokenizer) if lp else self.tokenizer.decode([token_id])
                token_logprobs.append(_value(lp.logprob) if lp else None)
                top = {}
                for tid, cand in _top(position, self.num_top):
                    top[_token_text(tid, cand, self.tokenizer)] = _value(cand.logprob)
                if lp is not None:   # vLLM and OpenAI list the chosen token among the alternatives too
                    top.setdefault(text, _value(lp.logprob))
                top_logprobs.append(top)
            tokens.append(text)
            text_offset.append(self.offset)
            self.offset += len(text)
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
                "text_offset": text_offset}


def chat_logprobs(token_ids: Sequence[int], positions: Sequence[dict[int, Logprob]], num_top: int,
                  tokenizer) -> dict:
    """`choices[i].logprobs` of /v1/chat/completions: {"content": [{token, logprob, bytes, top_logprobs}]}."""
    content = []
    for token_id, position in zip(token_ids, positions):
        lp = position.get(token_id)
        text = _token_text(token_id, lp, tokenizer) if lp else tokenizer.decode([token_id])
        content.append({
            "token": text, "logprob": _value(lp.logprob) if lp else _FLOOR, "bytes": list(text.encode("utf-8")),
            "top_logprobs": [{"token": t, "logprob": _value(c.logprob), "bytes": list(t.encode("utf-8"))}
                             for tid, c in _top(position, num_top)
                             for t in (_token_text(tid, c, tokenizer),)]})
    return {"content": content}


def prompt_logprobs_json(token_ids: Sequence[int], positions: Sequence[dict[int, Logprob] | None] | None,
                         num_top: int) -> list[dict[str, dict] | None] | None:
    """vLLM's `prompt_logprobs` field: one entry per prompt token, null for the first (nothing predicts
    it), else {token id: {"logprob", "rank", "decoded_token"}} holding the prompt's own token and the
    `num_top` most likely. The engine may have computed more alternatives (echo with a larger
    `logprobs` shares the same rows): the ones past `num_top` are left out."""
    if positions is None:
        return None
    out: list[dict[str, dict] | None] = []
    for token_id, position in zip(token_ids, positions):
        if position is None:
            out.append(None)
            continue
        # The prompt's own token comes first with its true rank; the top ones carry ranks 1..N.
        out.append({str(tid): {"logprob": _value(lp.logprob), "rank": lp.rank, "decoded_token": lp.decoded_token}
                    for tid, lp in position.items()
                    if tid == token_id or (lp.rank is not None and lp.rank <= num_top)})
    return out
