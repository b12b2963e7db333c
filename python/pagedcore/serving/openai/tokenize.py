"""POST /tokenize and /detokenize, in vLLM's shapes: the model's tokenizer without generating."""

from __future__ import annotations

from fastapi import Request

from pagedcore.serving.openai.body import parse_request
from pagedcore.serving.openai.chat_template import render_chat
from pagedcore.serving.openai.errors import bad_request
from pagedcore.serving.openai.protocol import DetokenizeRequest, TokenizeRequest
from pagedcore.serving.state import ServerState


async def tokenize(request: Request, state: ServerState) -> dict:
    req = await parse_request(request, TokenizeRequest, state.max_request_body_bytes)
    state.check_model(req.model)
    state.require_engine()
    if (req.prompt is None) == (req.messages is None):
        raise bad_request("send either 'prompt' (a string) or 'messages' (a chat), not both or neither", "prompt")
    if req.prompt is not None:
        add_special = True if req.add_special_tokens is None else req.add_special_tokens
        tokens = state.tokenizer.encode(req.prompt, add_special_tokens=add_special)
    else:
        if not req.messages:
            raise bad_request("messages is empty; send at least one message", "messages")
        tokens = render_chat(state.tokenizer, req.chat_template or state.chat_template, req.messages,
                             add_generation_prompt=req.add_generation_prompt,
                             continue_final_message=req.continue_final_message,
                             add_special_tokens=bool(req.add_special_tokens),
                             template_kwargs=req.chat_template_kwargs)
    token_strs = state.tokenizer.convert_ids_to_tokens(tokens) if req.return_token_strs else None
    return {"count": len(tokens), "max_model_len": state.max_model_len, "tokens": tokens, "token_strs": token_strs}


async def detokenize(request: Request, state: ServerState) -> dict:
    req = await parse_request(request, DetokenizeRequest, state.max_request_body_bytes)
    state.check_model(req.model)
    state.require_engine()
    bad = [t for t in req.tokens if not 0 <= t < state.vocab_size]
    if bad:
        raise bad_request(f"tokens has id {bad[0]}, outside this model's vocabulary [0, {state.vocab_size})", "tokens")
    return {"prompt": state.tokenizer.decode(req.tokens)}
