"""The sampler's parts: per-step metadata, logit edits, truncation, the random draw, logprobs.
`pagedcore.sampling.sampler.Sampler` puts them together."""

from pagedcore.sampling.logprobs import gather_logprobs, logprob_dicts, prompt_logprobs
from pagedcore.sampling.metadata import SamplingMetadata, TokenPairs, make_generator

__all__ = ["SamplingMetadata", "TokenPairs", "make_generator", "gather_logprobs", "logprob_dicts",
           "prompt_logprobs"]
