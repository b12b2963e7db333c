"""Structured output: constraints (JSON schema, regex, choice, grammar) compiled by xgrammar into
grammars, and the per-step token bitmasks that keep each constrained sequence inside its grammar.

    add_request ─▶ GrammarCache.compile (cached by constraint) ─▶ one GrammarMatcher per sequence
    each step   ─▶ GrammarBitmask.start_early_fill (a worker thread, during the forward, with a spare core)
                ─▶ GrammarBitmask.fill (constrained rows) ─▶ sampling.grammar_mask.apply ─▶ sample
                ─▶ matcher.accept_token(sampled) ─▶ terminated: the sequence ends with "stop"
"""

from pagedcore.structured_output.bitmask import GrammarBitmask
from pagedcore.structured_output.compiler import ConstraintError, GrammarCache, new_matcher
from pagedcore.structured_output.limits import ConstraintLimits

__all__ = ["GrammarCache", "GrammarBitmask", "ConstraintError", "ConstraintLimits", "new_matcher"]
