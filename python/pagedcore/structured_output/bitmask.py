"""GrammarBitmask: one step's allowed-token bitmask of the constrained rows, filled by xgrammar.

A reusable int32 buffer [rows, ceil(vocab / 32)] (bit j of a row set = token j allowed), grown when a
step has more rows than any before. Every constrained row is filled in one batched call; the
unconstrained rows of the buffer are left stale and never read.

Early fill: a row's mask depends only on the tokens its matcher has accepted, all known once the
scheduler has picked the step's sequences. `start_early_fill` hands the fill to a worker thread
before the forward (xgrammar releases the GIL), and `fill` takes its rows when the logits arrive, so
the fill overlaps the forward instead of following it. Rows it did not cover (n > 1 children made at
the first sample) are filled then. It is worth it only with a core the forward does not use:
`overlap` is on by default only then (PAGEDCORE_GRAMMAR_OVERLAP=1 / 0 forces it).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import torch

ENV_VAR = "PAGEDCORE_GRAMMAR_OVERLAP"


def _new_buffer(num_rows: int, vocab_size: int) -> torch.Tensor:
    import xgrammar as xgr

    return xgr.allocate_token_bitmask(max(num_rows, 8), vocab_size)   # int32 [capacity, ceil(vocab / 32)]


def _new_batch_matcher():
    import xgrammar as xgr

    # One thread: on a small machine more threads only contend with the forward's.
    return xgr.BatchGrammarMatcher(max_threads=max(1, min(4, (os.cpu_count() or 2) // 2)))


class GrammarBitmask:
    def __init__(self, vocab_size: int, overlap: bool | None = None):
        self.vocab_size = vocab_size
        setting = os.environ.get(ENV_VAR, "auto").strip().lower()
        self._overlap_forced = overlap if overlap is not None else (
            None if setting == "auto" else setting not in ("0", "false", "off", "no"))
        try:
            self._num_cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            self._num_cpus = os.cpu_count() or 1
        self._buffer: torch.Tensor | None = None    # int32 [capacity, ceil(vocab / 32)], filled at sample time
        self._batch = None                           # xgrammar.BatchGrammarMatcher of the engine thread
        # The early fill: its own buffer, batch matcher and worker thread (made on first use).
        self._early_buffer: torch.Tensor | None = None   # int32 [capacity, ceil(vocab / 32)]
        self._early_batch = None
        self._early_executor: ThreadPoolExecutor | None = None
        self._early: Future | None = None            # the fill in flight, or done and not yet taken
        self._early_matchers: list = []              # matchers[i] filled row i of _early_buffer

    @property
    def overlap(self) -> bool:
        """Fill early on a worker thread: forced by the constructor or env, else when the CPUs this
        process may use outnumber the forward's threads (checked each step: the thread team resizes)."""
        if self._overlap_forced is not None:
            return self._overlap_forced
        return self._num_cpus > torch.get_num_threads()

    @overlap.setter
    def overlap(self, value: bool | None) -> None:
        """True / False force it; None: decided each step as above."""
        self._overlap_forced = value

    def start_early_fill(self, matchers: Sequence) -> None:
        """Fills rows 0..len(matchers)-1 of the early buffer on the worker thread. Until `wait` (or
        `fill`) returns, the caller must not touch these matchers."""
        self.wait()
        self._early_matchers = []
        if not matchers:
            return
        if self._early_buffer is None or self._early_buffer.shape[0] < len(matchers):
            self._early_buffer = _new_buffer(len(matchers), self.vocab_size)
        if self._early_executor is None:
            self._early_batch = _new_batch_matcher()
            self._early_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pagedcore-grammar-mask")
        self._early_matchers = list(matchers)
        self._early = self._early_executor.submit(self._early_batch.batch_fill_next_token_bitmask,
                                                  self._early_matchers, self._early_buffer,
                                                  list(range(len(matchers))))

    def wait(self) -> None:
        """Waits for the early fill in flight (its matchers may then be read or advanced again)."""
        early, self._early = self._early, None
        if early is not None:
            early.result()    # re-raises the fill's error here, on the engine thread

    def discard_early(self) -> None:
        """Drops the early fill (waiting for it first): called before matchers advance, so that a fill
        no sample took (a step whose rows all went elsewhere) is never read after its matchers moved."""
        self.wait()
        self._early_matchers = []

    def fill(self, num_rows: int, row_ids: Sequence[int], matchers: Sequence) -> torch.Tensor:
        """The bitmask of a step with num_rows sampling rows: int32 [num_rows, ceil(vocab / 32)], rows
        row_ids filled from their matchers (matchers[i] is row row_ids[i]'s), the others undefined.
        Rows the early fill covered (the same matcher objects, untouched since) are taken from it."""
        self.wait()
        early = self._early_matchers
        self._early_matchers = []
        if early and len(early) == len(matchers) and list(row_ids) == list(range(len(matchers))) and \
                self._early_buffer.shape[0] >= num_rows and all(a is b for a, b in zip(early, matchers)):
            return self._early_buffer[:num_rows]       # the common case: the early fill is the answer
        if self._buffer is None or self._buffer.shape[0] < num_rows:
            self._buffer = _new_buffer(num_rows, self.vocab_size)
        bitmask = self._buffer[:num_rows]
        early_row = {id(m): i for i, m in enumerate(early)}
        copy_to, copy_from, missing_rows, missing = [], [], [], []
        for row, matcher in zip(row_ids, matchers):
            source = early_row.get(id(matcher))
            if source is not None:
                copy_to.append(row)
                copy_from.append(source)
            else:
                missing_rows.append(row)
                missing.append(matcher)
        if copy_to:
            bitmask[copy_to] = self._early_buffer[copy_from]
        if missing:
            if self._batch is None:
                self._batch = _new_batch_matcher()
            self._batch.batch_fill_next_token_bitmask(missing, bitmask, missing_rows)
        return bitmask
