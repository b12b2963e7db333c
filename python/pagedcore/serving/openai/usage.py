"""The usage object: prompt / completion / total tokens and prompt_tokens_details.cached_tokens."""

from __future__ import annotations

from pagedcore.outputs import RequestOutput


class Usage:
    """Counts over one HTTP request's engine requests (one per prompt), fed delta or final outputs."""

    def __init__(self, num_prompts: int):
        self.prompt_tokens = [0] * num_prompts
        self.cached_tokens = [0] * num_prompts
        self.completion_tokens = 0

    def add(self, index: int, output: RequestOutput) -> None:
        """output: the index-th prompt's delta (streaming) or final output."""
        self.prompt_tokens[index] = len(output.prompt_token_ids)
        self.cached_tokens[index] = output.num_cached_tokens or 0
        self.completion_tokens += sum(len(c.token_ids) for c in output.outputs)

    def as_dict(self) -> dict:
        prompt = sum(self.prompt_tokens)
        return {"prompt_tokens": prompt, "completion_tokens": self.completion_tokens,
                "total_tokens": prompt + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": sum(self.cached_tokens)}}


def usage_of(outputs: list[RequestOutput]) -> dict:
    usage = Usage(len(outputs))
    for i, output in enumerate(outputs):
        usage.add(i, output)
    return usage.as_dict()
