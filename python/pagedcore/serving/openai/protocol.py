"""Request bodies of the OpenAI-compatible API (pydantic), with vLLM's extra sampling fields.

Strict types: a string where a number belongs is a 400 naming the field, never silently coerced.
Ranges are not checked here but by SamplingParams (one set of rules for every front end).
A null field means its default, as on api.openai.com (many clients send every field, unset ones as
null). Unknown fields are ignored with a warning, as vLLM does, so clients that send newer OpenAI
fields keep working. Responses are plain dicts built beside their handlers (completions.py, chat.py).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_defaults(cls, data):
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data


class StreamOptions(_Body):
    include_usage: bool = False            # one last chunk with the usage of the whole request
    continuous_usage_stats: bool = False   # vLLM: usage so far in every chunk


# OpenAI's documented temperature range. Above it the HTTP API refuses (as api.openai.com does)
# rather than clamping: a client asking for 5 is told, not quietly given 2.
MAX_TEMPERATURE = 2.0


class SamplingFields(_Body):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    @model_validator(mode="after")
    def _openai_rules(self):
        # Raised as APIError (not ValueError) so pydantic passes it through with the field named.
        from pagedcore.serving.openai.errors import bad_request

        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options is only allowed with \"stream\": true", "stream_options")
        if self.temperature is not None and self.temperature > MAX_TEMPERATURE:
            raise bad_request(f"temperature={self.temperature} is above the maximum of {MAX_TEMPERATURE} (OpenAI's "
                              "range is 0 to 2)", "temperature")
        for name in ("logprobs", "top_logprobs"):
            value = getattr(self, name, None)
            if value is not None and not isinstance(value, bool) and value < 0:
                raise bad_request(f"{name}={value}: must be >= 0; -1 (the whole vocabulary, which vLLM accepts) is "
                                  "not supported here: ask for at most --max-logprobs alternatives", name)
        # vLLM's rules: -1 is the whole vocabulary (then held to --max-logprobs like any count); a
        # count > 0 (or -1) is refused with stream=true, 0 (the prompt tokens' own logprobs) streams.
        value = self.prompt_logprobs
        if value is not None:
            if value < -1:
                raise bad_request(f"prompt_logprobs={value}: must be >= 0, or -1 for the whole vocabulary",
                                  "prompt_logprobs")
            if self.stream and value != 0:
                raise bad_request(f"prompt_logprobs={value} is not available with \"stream\": true (as in vLLM); "
                                  "set stream to false, or prompt_logprobs to 0 for the prompt tokens' own logprobs",
                                  "prompt_logprobs")
        return self

    model: str | None = None
    n: int = 1
    temperature: float | None = None       # None: the model's generation_config default, else 1.0
    top_p: float | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None   # token id (as a JSON string key) -> bias in [-100, 100]
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None                # accepted for compatibility; not used
    # vLLM's extra body fields.
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    priority: int = 0                      # lower runs first, with --scheduling-policy priority
    # Logprobs of every prompt position (the first is null): the top-N alternatives plus the prompt's
    # own token; -1 = the whole vocabulary. Per choice on /v1/completions, top level on chat.
    prompt_logprobs: int | None = None
    # vLLM's beam search fields: n is the beam width; HF's length_penalty and early_stopping.
    use_beam_search: bool = False
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    # Structured output (structured.py reads them; at most one may be set).
    response_format: dict[str, Any] | None = None      # {"type": "text" | "json_object" | "json_schema"}
    structured_outputs: dict[str, Any] | None = None   # vLLM: {"json" | "regex" | "choice" | "grammar" | ...}
    guided_json: str | dict[str, Any] | None = None    # vLLM's older spellings of the same
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None
    guided_whitespace_pattern: str | None = None       # refused: xgrammar has no whitespace pattern


class CompletionRequest(SamplingFields):
    # A string, a batch of strings, token ids, or a batch of token-id lists.
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = None          # unset: 16 (OpenAI's and vLLM's default), cut to what fits
    logprobs: int | None = None            # top-N alternatives per token (plus the chosen one)
    echo: bool = False                     # put the prompt before the completion
    best_of: int | None = None
    suffix: str | None = None
    add_special_tokens: bool = True        # vLLM: BOS etc. when tokenizing a string prompt


class ContentPart(_Body):
    type: str
    text: str | None = None


class ChatMessage(_Body):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None   # an assistant's earlier calls, for the chat template
    tool_call_id: str | None = None                  # a "tool" message: the call it answers


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None          # deprecated by OpenAI in favour of max_completion_tokens
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None        # alternatives per token, with logprobs=true
    echo: bool = False                     # vLLM: repeat the last message when it is the assistant's
    add_generation_prompt: bool = True
    continue_final_message: bool = False   # vLLM: extend the last (assistant) message instead
    add_special_tokens: bool = False       # the chat template writes the special tokens itself
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # Tool calling (tools.py): functions the model may call, and whether / which it must.
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None   # false: at most one call per reply (null: true, OpenAI's default)


class TokenizeRequest(_Body):
    """vLLM's /tokenize: a prompt, or chat messages rendered through the chat template."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None   # default: True for a prompt, False for messages
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]


# Human words for the unions, used when a value matches none of their members.
UNION_TYPES = {
    "prompt": "a string, a list of strings, a list of token ids or a list of token-id lists",
    "stop": "a string or a list of strings",
    "content": "a string, a list of content parts ({\"type\": \"text\", \"text\": ...}) or null",
    "guided_json": "a JSON schema (an object) or its JSON text",
}
