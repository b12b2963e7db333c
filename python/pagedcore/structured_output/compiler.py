"""GrammarCache: StructuredOutputsParams -> an xgrammar CompiledGrammar, once per distinct constraint.

One per engine. The tokenizer info (every token's bytes, for the model's vocabulary size) is built on
the first constrained request, so engines that never see one pay nothing. Front ends call `compile`
before queueing a request (a bad constraint is then their 400 / INVALID_ARGUMENT, naming the field);
the engine's add_request calls it again and gets the cached grammar. Thread-safe: front ends compile
on their own threads while the engine thread steps.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Sequence

from pagedcore.sampling_params import StructuredOutputsParams

# xgrammar's C++ errors start with "[hh:mm:ss] /path/file.cc:123: "; the client needs only the rest.
_LOG_PREFIX = re.compile(r"^\s*\[[\d:]+\]\s+\S+:\d+:\s*")
_CACHE_LIMIT = 512      # distinct constraints kept; a server sees few, a fuzzing client many


class ConstraintError(ValueError):
    """A constraint the compiler refused; `field` is its name in StructuredOutputsParams."""

    def __init__(self, field: str, message: str):
        super().__init__(f"structured_outputs.{field} could not be compiled: {message}")
        self.field = field
        self.reason = message


def compiler_message(error: BaseException) -> str:
    lines = [_LOG_PREFIX.sub("", line) for line in str(error).strip().splitlines() if line.strip()]
    return " ".join(lines) or type(error).__name__


def choice_grammar(choices: Sequence[str]) -> str:
    """An EBNF grammar whose only sentences are the choices."""
    # GBNF string literals take JSON's escapes (\\", \\\\, \\n, \\uXXXX); keep other characters raw.
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def new_matcher(grammar):
    """A fresh matcher (one per sequence: its state is that sequence's position in the grammar)."""
    import xgrammar as xgr

    return xgr.GrammarMatcher(grammar)


class GrammarCache:
    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: Sequence[int]):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size                 # the logits' width: tokens past the tokenizer's are masked
        self.stop_token_ids = list(stop_token_ids)   # what ends a finished grammar: the engine's EOS ids
        self._lock = threading.Lock()
        self._compiler = None
        self._grammars: dict[tuple, object] = {}     # StructuredOutputsParams.key -> CompiledGrammar

    def compile(self, constraint: StructuredOutputsParams):
        """The constraint's CompiledGrammar (cached). Raises ConstraintError naming the field."""
        key = constraint.key
        grammar = self._grammars.get(key)
        if grammar is not None:
            return grammar
        compiler = self._get_compiler()
        kind = constraint.kind
        try:
            grammar = self._compile(compiler, constraint, kind)
        except (RuntimeError, ValueError, TypeError) as error:
            raise ConstraintError(kind, compiler_message(error)) from None
        with self._lock:
            if len(self._grammars) >= _CACHE_LIMIT:
                self._grammars.pop(next(iter(self._grammars)))   # oldest first
            self._grammars[key] = grammar
        return grammar

    @staticmethod
    def _compile(compiler, c: StructuredOutputsParams, kind: str):
        any_whitespace = not c.disable_any_whitespace
        if kind == "json":
            schema = c.json if isinstance(c.json, str) else json.dumps(c.json)
            return compiler.compile_json_schema(schema, any_whitespace=any_whitespace)
        if kind == "json_object":
            # Any object: strict_mode off, or {"type": "object"} would admit only {}.
            return compiler.compile_json_schema('{"type": "object"}', any_whitespace=any_whitespace,
                                                strict_mode=False)
        if kind == "regex":
            return compiler.compile_regex(c.regex)
        if kind == "choice":
            return compiler.compile_grammar(choice_grammar(c.choice))
        return compiler.compile_grammar(c.grammar)

    def _get_compiler(self):
        with self._lock:
            if self._compiler is None:
                if self.tokenizer is None:
                    raise ValueError("structured output needs the model's tokenizer; this engine was built "
                                     "without one")
                import xgrammar as xgr

                info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocab_size,
                                                          stop_token_ids=self.stop_token_ids)
                self._compiler = xgr.GrammarCompiler(info, max_threads=max(1, min(8, os.cpu_count() or 1)))
            return self._compiler
