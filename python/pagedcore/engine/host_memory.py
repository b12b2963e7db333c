"""Committing a host tensor's pages up front, so the process's resident memory is what it reserved.

torch.empty on the CPU maps memory that the kernel backs with pages only when first written. The KV
cache is one such reservation of gigabytes, and the block pool's LRU free list walks every block
before it reuses one (that is what keeps the prefix cache's contents longest), so an uncommitted
cache made the server's RSS climb by every newly touched block until the whole cache was resident:
hundreds of MB per minute under load, never returned, and an out-of-memory kill hours after start
instead of a clear error at start (issue "Memory grows without bound under load").
Committing at start-up gives a flat RSS from the first request on and moves the page faults out of
the step loop.

On a VM whose guest memory the host backs only when first touched, that commit is slow: 4 GiB took
9.6-21.9 s on the Zen 5 Firecracker guest (2026-12-04), nearly all of a server's start-up, for a model
that loads in one second. So the engine commits in the background by default (commit_in_background):
the server answers from the first second, and the cache's pages come in on an idle-priority thread,
in the seconds after start-up (minutes where requests keep every core busy from the first second),
not in the step loop hours later.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import functools
import logging
import mmap
import os
import threading
import time
import weakref

import torch

from pagedcore import _core

_MADV_POPULATE_WRITE = 23   # Linux >= 5.14: fault the pages in, writable, inside one system call
_PAGE_SIZE = mmap.PAGESIZE
# A background commit's madvise calls. The kernel holds the process's mmap lock through a call, and the
# engine's own mmap / munmap (a step's large temporaries) wait for it: with one call for 4 GiB an mmap +
# munmap of 64 MiB waited the whole commit (1.9-3.9 s, warm), with 1 MiB calls 17-22 ms (median; at most
# 45 ms) on the Zen 5 guest, Linux 6.18 (`bench/bench_memory.py commit --background`). Between two calls
# the thread also lets go of the tensor, so a released cache stops the commit.
_BACKGROUND_CHUNK_BYTES = 2**20

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=None)
def _libc():
    """The C library, loaded once (errno kept for the calls below); None where it cannot be loaded."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:
        return None


def _madvise():
    libc = _libc()
    try:
        madvise = libc.madvise
    except AttributeError:   # no libc, or one without madvise
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


def _flat_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of a contiguous tensor, or of a permuted view of one (a block-major KV cache), in memory
    order: uint8 [num_bytes]."""
    if not tensor.is_contiguous():
        order = sorted(range(tensor.dim()), key=lambda d: -tensor.stride(d))
        tensor = tensor.permute(order)
        if not tensor.is_contiguous():
            raise ValueError("committing pages needs a contiguous tensor (or a permuted view of one)")
    return tensor.view(-1).view(torch.uint8)


def _whole_pages(tensor: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """-> (its bytes as _flat_bytes gives them, first whole page's address, address past the last whole
    page) of a contiguous tensor or a permuted view of one."""
    flat = _flat_bytes(tensor)
    num_bytes = flat.numel()
    start = flat.data_ptr()
    begin = (start + _PAGE_SIZE - 1) // _PAGE_SIZE * _PAGE_SIZE      # first whole page
    end = (start + num_bytes) // _PAGE_SIZE * _PAGE_SIZE              # past the last whole page
    return flat, begin, end


def commit_pages(tensor: torch.Tensor, huge_pages: bool = False) -> tuple[int, int]:
    """Makes every page of a contiguous CPU tensor resident now. The contents stay undefined (the
    kernel zero-fills the pages, or the fallback writes a zero byte per page). huge_pages first
    advises the range onto 2 MB transparent huge pages: on a quiet machine the populate then takes
    ~0.13 s a GiB against ~0.9 s in 4 KB pages, but where memory must be compacted first it took
    3 s a GiB (`bench/bench_memory.py commit`; the engine measures it at start-up, see kv_cache.allocate).
    Returns (bytes committed, bytes advised onto huge pages)."""
    if not tensor.is_cpu or tensor.numel() == 0:
        return 0, 0
    flat, begin, end = _whole_pages(tensor)                           # flat: uint8 [num_bytes]
    num_bytes = flat.numel()
    advised = _core.advise_huge_pages(flat.data_ptr(), num_bytes) if huge_pages else 0
    madvise = _madvise()
    # One call over the whole range: split into chunks on threads it ran 5-50x slower with huge pages.
    if madvise is not None and end > begin and madvise(begin, end - begin, _MADV_POPULATE_WRITE) == 0:
        flat[0] = 0                                                   # the partial pages at each end
        flat[-1] = 0
    else:
        # Old kernels (EINVAL) or no libc: one write per page faults each in. Slower (a trap per page),
        # same result. The cache holds no data yet, so overwriting a byte per page is harmless.
        flat[::_PAGE_SIZE].zero_()
        flat[-1] = 0
    with _tally_lock:
        _tally[0] += num_bytes
        _tally[1] += num_bytes
    return num_bytes, advised


class BackgroundCommit:
    """commit_pages on a daemon thread, 1 MiB a madvise call, for a tensor that is in use meanwhile.

    MADV_POPULATE_WRITE never writes data: a page the engine has written already is left as it is, and
    one it has not is a zero page either way, so the engine may write the cache from the first moment.
    The two partial pages at the ends are touched by the caller first, before anything else writes the
    tensor (that touch writes a byte). The thread holds the tensor only during a call: a cache released
    before the end stops the commit there, so an engine dropped early does not keep its cache alive."""

    def __init__(self, tensor: torch.Tensor, begin: int, end: int, madvise, what: str):
        self.num_bytes = end - begin
        self.committed_bytes = 0
        self.seconds: float | None = None     # once done
        self.error: str | None = None         # the failed call's errno text; None if it finished or stopped
        self.stopped = False                  # the tensor was released before the end
        self._what = what
        self._exiting = False                 # the interpreter is exiting: stop at the next chunk (_stop_at_exit)
        self._done = threading.Event()
        self._tensor = weakref.ref(tensor)
        self._thread = threading.Thread(target=self._run, args=(begin, end, madvise),
                                        name="pagedcore-commit", daemon=True)
        with _tally_lock:
            _running.add(self)
        self._thread.start()

    def _run(self, begin: int, end: int, madvise) -> None:
        t0 = time.perf_counter()
        _idle_priority()
        try:
            at = begin
            while at < end:
                tensor = None if self._exiting else self._tensor()
                if tensor is None:
                    self.stopped = True
                    break
                n = min(_BACKGROUND_CHUNK_BYTES, end - at)
                if madvise(at, n, _MADV_POPULATE_WRITE) != 0:
                    self.error = os.strerror(ctypes.get_errno())
                    break
                del tensor
                at += n
                self.committed_bytes = at - begin
        finally:
            self.seconds = time.perf_counter() - t0
            with _tally_lock:
                _running.discard(self)
                _tally[0] += self.committed_bytes
                _tally[1] += self.num_bytes
            self._done.set()
        if self.error is not None:
            logger.warning("%s: the background commit stopped after %.2f of %.2f GiB: madvise: %s (the rest "
                           "comes in as the engine first writes it)", self._what, self.committed_bytes / 2**30,
                           self.num_bytes / 2**30, self.error)
        elif not self.stopped:
            logger.info("%s: %.2f GiB committed in the background in %.2f s", self._what,
                        self.committed_bytes / 2**30, self.seconds)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """True once the thread has finished (committed everything, failed or stopped)."""
        return self._done.wait(timeout)


_running: set[BackgroundCommit] = set()
_tally = [0, 0]                  # bytes committed, bytes asked to commit: commits finished in this process
_tally_lock = threading.Lock()


def commit_totals() -> tuple[int, int]:
    """(bytes committed, bytes asked to commit) over every commit this process started, finished or
    running: equal once the KV cache is resident; while a background commit runs (or after one failed)
    the first lags. The /metrics gauges kv_cache_committed_bytes / kv_cache_commit_target_bytes."""
    with _tally_lock:
        running = list(_running)
        return (_tally[0] + sum(c.committed_bytes for c in running), _tally[1] + sum(c.num_bytes for c in running))


def _idle_priority() -> None:
    """This thread runs only where a core would idle otherwise (SCHED_IDLE; on Linux the call sets the
    calling thread's policy, not the process's)."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        pass


def commit_in_background(tensor: torch.Tensor, what: str = "KV cache") -> BackgroundCommit | None:
    """Starts committing a contiguous CPU tensor's pages on a thread (BackgroundCommit). None where that
    cannot run safely: without MADV_POPULATE_WRITE the only way is a write per page, which would race
    the engine's own writes; the caller commits in the foreground (commit_pages) instead."""
    if not tensor.is_cpu or tensor.numel() == 0:
        return None
    flat, begin, end = _whole_pages(tensor)                           # flat: uint8 [num_bytes]
    madvise = _madvise()
    if madvise is None or end <= begin or madvise(begin, min(_PAGE_SIZE, end - begin), _MADV_POPULATE_WRITE) != 0:
        return None
    flat[0] = 0                                                       # the partial pages at each end, now,
    flat[-1] = 0                                                      # before any kernel writes the tensor
    return BackgroundCommit(tensor, begin, end, madvise, what)


def resident_fraction(tensor: torch.Tensor) -> float:
    """Share of a CPU tensor's whole pages (contiguous, or a permuted view) resident now (mincore): its own pages,
    whatever the rest of the process allocates or frees meanwhile, which a difference of the process's
    RSS is not (tests; in a full run the garbage collector freed another test's memory between two
    readings of RSS)."""
    _, begin, end = _whole_pages(tensor)
    pages = (end - begin) // _PAGE_SIZE
    if pages <= 0:
        return 1.0
    mincore = _libc().mincore
    mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    vec = ctypes.create_string_buffer(pages)                          # [pages] bit 0: resident
    if mincore(begin, end - begin, vec) != 0:
        raise OSError(ctypes.get_errno(), "mincore: " + os.strerror(ctypes.get_errno()))
    return sum(b & 1 for b in vec.raw) / pages


@atexit.register
def _stop_at_exit() -> None:
    """Stops the running commits and waits for them before the interpreter finalizes. A daemon thread still
    running then is killed (pthread_exit) when it next takes the GIL, and if that happens inside torch's
    release of the last reference to a cache it was holding (a C++ frame that may not unwind), the process
    aborts ("terminate called without an active exception"; seen with an engine dropped just before exit).
    Each madvise call is 1 MiB, so the wait is short."""
    running = list(_running)
    for commit in running:
        commit._exiting = True
    for commit in running:
        commit.wait(10.0)


def wait_for_background_commits(timeout: float | None = None) -> bool:
    """Waits for every background commit of this process (benchmarks: a quiet machine before timing;
    tests: a resident cache). True when none is left running."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for commit in list(_running):
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not commit.wait(left):
            return False
    return True
