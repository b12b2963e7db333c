"""GrammarCache: StructuredOutputsParams -> an xgrammar CompiledGrammar, once per distinct constraint.

One per engine. The tokenizer info (every token's bytes, for the model's vocabulary size) is built on
the first constrained request, so engines that never see one pay nothing. Front ends call `compile`
before queueing a request (a bad constraint is then their 400 / INVALID_ARGUMENT, naming the field);
the engine's add_request calls it again and gets the cached grammar. Thread-safe: front ends compile
on their own threads while the engine thread steps.

Bounded (limits.py): a constraint over `limits.max_bytes` is refused before compiling; each compile runs
on a thread of its own and the caller waits at most `limits.compile_timeout_s`. xgrammar cannot be
interrupted, so an overrun compile finishes in the background (it releases the GIL) and its result is
dropped; the constraint is remembered as refused, so sending it again costs nothing.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from pagedcore.sampling_params import StructuredOutputsParams
from pagedcore.structured_output.limits import ConstraintLimits, constraint_bytes
from pagedcore.structured_output.schema_support import unsupported_reason

# xgrammar's C++ errors start with "[hh:mm:ss] /path/file.cc:123: "; the client needs only the rest.
_LOG_PREFIX = re.compile(r"^\s*\[[\d:]+\]\s+\S+:\d+:\s*")
_CACHE_LIMIT = 512      # distinct constraints kept; a server sees few, a fuzzing client many
_REFUSED_LIMIT = 256    # overrun constraints remembered as refused


class ConstraintError(ValueError):
    """A constraint the compiler refused; `field` is its name in StructuredOutputsParams. `limit` is
    None when xgrammar found it invalid, else the bound it broke ("max_bytes" or "compile_timeout_s")."""

    def __init__(self, field: str, message: str, limit: str | None = None):
        super().__init__(f"structured_outputs.{field} could not be compiled: {message}")
        self.field = field
        self.reason = message
        self.limit = limit


def compiler_message(error: BaseException) -> str:
    lines = [_LOG_PREFIX.sub("", line) for line in str(error).strip().splitlines() if line.strip()]
    return " ".join(lines) or type(error).__name__


def choice_grammar(choices: Sequence[str]) -> str:
    """An EBNF grammar whose only sentences are the choices."""
    # GBNF string literals take JSON's escapes (\\", \\\\, \\n, \\uXXXX); keep other characters raw.
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def schema_gate(schema) -> str | None:
    """Why the grammar would not hold `schema` (a JSON Schema, parsed or as text), or None: see
    schema_support.py. Text that is not JSON is left to xgrammar, whose message names the error."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            return None
    return unsupported_reason(schema)


def new_matcher(grammar):
    """A fresh matcher (one per sequence: its state is that sequence's position in the grammar)."""
    import xgrammar as xgr

    return xgr.GrammarMatcher(grammar)


class GrammarCache:
    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: Sequence[int],
                 limits: ConstraintLimits | None = None):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size                 # the logits' width: tokens past the tokenizer's are masked
        self.stop_token_ids = list(stop_token_ids)   # what ends a finished grammar: the engine's EOS ids
        self.limits = limits or ConstraintLimits()
        self.num_hits = 0                            # compile() answered from the cache
        self.num_misses = 0                          # compile() that ran xgrammar (whatever came of it)
        self.compile_listeners: list[Callable[[float], None]] = []   # seconds of each successful compile
        self._lock = threading.Lock()
        self._compiler = None
        self._grammars: dict[tuple, object] = {}     # StructuredOutputsParams.key -> CompiledGrammar
        self._refused: dict[tuple, ConstraintError] = {}   # key -> why (overran the compile timeout)

    def compile(self, constraint: StructuredOutputsParams):
        """The constraint's CompiledGrammar (cached). Raises ConstraintError naming the field."""
        key = constraint.key
        grammar = self._grammars.get(key)
        if grammar is not None:
            with self._lock:
                self.num_hits += 1
            return grammar
        kind = constraint.kind
        refused = self._refused.get(key)
        if refused is not None:
            raise refused
        limits = self.limits
        size = constraint_bytes(constraint)
        if size > limits.max_bytes:
            raise ConstraintError(kind, f"it is {size} bytes, more than the limit of {limits.max_bytes}; send a "
                                        "smaller constraint, or raise the limit (pagedcore serve "
                                        "--structured-outputs-max-bytes)", "max_bytes")
        if kind == "json":
            reason = schema_gate(constraint.json)
            if reason is not None:
                raise ConstraintError(kind, reason)
        compiler = self._get_compiler()
        with self._lock:
            self.num_misses += 1
        started = time.perf_counter()
        try:
            grammar = self._compile_bounded(compiler, constraint, kind, limits.compile_timeout_s)
        except FutureTimeout:
            error = ConstraintError(kind, f"compiling it took longer than {limits.compile_timeout_s:g} s, so it "
                                          "was refused; simplify it (smaller repetition counts, fewer properties "
                                          "or rules), or raise the limit (pagedcore serve "
                                          "--structured-outputs-compile-timeout)", "compile_timeout_s")
            with self._lock:
                if len(self._refused) >= _REFUSED_LIMIT:
                    self._refused.pop(next(iter(self._refused)))
                self._refused[key] = error
            raise error from None
        except (RuntimeError, ValueError, TypeError) as error:
            raise ConstraintError(kind, compiler_message(error)) from None
        seconds = time.perf_counter() - started
        with self._lock:
            if len(self._grammars) >= _CACHE_LIMIT:
                self._grammars.pop(next(iter(self._grammars)))   # oldest first
            self._grammars[key] = grammar
        for listener in self.compile_listeners:
            listener(seconds)
        return grammar

    def _compile_bounded(self, compiler, constraint: StructuredOutputsParams, kind: str, timeout_s: float):
        """Compiles on a daemon thread of its own and waits at most timeout_s (FutureTimeout past it); the
        thread of an overrun compile ends when xgrammar does, and nobody reads its result."""
        result: Future = Future()

        def run():
            try:
                result.set_result(self._compile(compiler, constraint, kind))
            except BaseException as error:   # handed to the waiting caller
                result.set_exception(error)

        threading.Thread(target=run, name="pagedcore-grammar-compile", daemon=True).start()
        return result.result(timeout=timeout_s)

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
