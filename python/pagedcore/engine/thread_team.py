"""The CPU thread team sized to the cores other processes leave free, re-checked while the engine runs.

Why: torch's OpenMP team (which our kernels share, or our kernels' own pool, which follows its size:
cpp/kernels/parallel.h, ops/kernel_threading.py) has one thread per core and every parallel region ends
at a barrier. When another process keeps one core busy, the team's
thread on that core gets a share of it, and each region waits for that thread: decode throughput
halves. A team of the free cores only runs at their full speed instead.

How: every `interval_s` (checked once per step: one clock read) it reads /proc/stat (busy time of
the CPUs this process may use) and /proc/self/stat (this process's own CPU time, every thread, its
spinning OpenMP workers included). The difference is what other processes used; the cores they keep
busy are taken from the team (torch.set_num_threads on the engine thread, which our kernels' OpenMP
regions follow). Two samples in a row must agree before the size changes, so a blip (a compiler, a
cron job) does not make it flap; the team grows back the same way. Cost when nobody else runs: a
clock read per step (~1 us) and two small file reads every interval_s (0.1-0.4 ms): under 0.1%.

On by default; PAGEDCORE_ADAPT_THREADS=0 turns it off (docs/serving-http.md, "CPU contention";
bench/bench_cpu_contention.py measures it). Without /proc (not Linux) it stays off.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable

import torch

logger = logging.getLogger(__name__)

# torch's own team size, read when the engine module is first imported (before any team has shrunk
# it): the ceiling of every later engine's team, so an engine built while another one's team is
# small (several engines in one process) can still grow back to the whole machine.
DEFAULT_MAX_THREADS = torch.get_num_threads()

ENV_VAR = "PAGEDCORE_ADAPT_THREADS"
# A core counts as taken when others keep it busy more than this share of the time: a process that
# runs a third of the time costs the team less than a thread lost for good.
BUSY_SHARE = 0.65
CONFIRMATIONS = 2          # samples in a row that must ask for the same new size


def enabled_by_env() -> bool:
    return os.environ.get(ENV_VAR, "1").strip().lower() not in ("0", "false", "off", "no")


def read_cpu_times(cpus: set[int]) -> tuple[int, int]:
    """(busy clock ticks of `cpus` summed, this process's user + system clock ticks)."""
    busy = 0
    with open("/proc/stat", "rb") as f:
        for line in f:               # "cpu " (all CPUs), then "cpu0", "cpu1", ..., then the rest
            if not line.startswith(b"cpu"):
                break
            if line[3:4] == b" ":
                continue
            fields = line.split()
            if int(fields[0][3:]) not in cpus:
                continue
            # user nice system idle iowait irq softirq steal ...: busy = all but idle and iowait;
            # steal counts as busy (the hypervisor gave the core to someone else).
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
            busy += user + nice + system + irq + softirq + steal
    with open("/proc/self/stat", "rb") as f:
        after_name = f.read().rsplit(b")", 1)[1].split()   # the name may hold spaces: cut after it
    own = int(after_name[11]) + int(after_name[12])        # utime, stime (fields 14 and 15)
    return busy, own


class ThreadTeam:
    """Call on_step() once per engine step, from the thread that runs the steps."""

    def __init__(self, max_threads: int, cpus: set[int] | None = None, interval_s: float = 0.5,
                 read_times: Callable[[set[int]], tuple[int, int]] = read_cpu_times,
                 set_threads: Callable[[int], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, ticks_per_s: int | None = None):
        self.cpus = cpus if cpus is not None else os.sched_getaffinity(0)
        self.max_threads = max(1, min(max_threads, len(self.cpus)))
        self.interval_s = interval_s
        self.read_times, self.clock = read_times, clock
        self.ticks_per_s = ticks_per_s or os.sysconf("SC_CLK_TCK")
        self.set_threads = set_threads or torch.set_num_threads
        self.num_threads = self.max_threads      # the size in force (set on the first step)
        self._synced = False
        self.other_cores = 0.0                    # cores other processes used over the last interval
        self.num_changes = 0
        self._candidate, self._votes = self.num_threads, 0
        self._last = (self.clock(), *self.read_times(self.cpus))
        self._next_check = self._last[0] + interval_s

    def on_step(self) -> None:
        if not self._synced:
            # OpenMP's team size is per calling thread, and another engine in this process may have
            # shrunk it: the stepping thread starts from the size this team believes in.
            self.set_threads(self.num_threads)
            self._synced = True
        now = self.clock()
        if now >= self._next_check:
            self._sample(now)

    def _sample(self, now: float) -> None:
        busy, own = self.read_times(self.cpus)
        t0, busy0, own0 = self._last
        self._last, self._next_check = (now, busy, own), now + self.interval_s
        ticks = (now - t0) * self.ticks_per_s
        if ticks <= 0:
            return
        self.other_cores = max(0.0, (busy - busy0) - (own - own0)) / ticks
        self._vote(self.size_for(self.other_cores))

    def size_for(self, other_cores: float) -> int:
        """The team for `other_cores` cores' worth of other work: a core is taken once it is busy more
        than BUSY_SHARE of the time."""
        taken = math.floor(other_cores + (1.0 - BUSY_SHARE))
        return max(1, min(self.max_threads, len(self.cpus) - taken))

    def _vote(self, size: int) -> None:
        if size == self.num_threads:
            self._candidate, self._votes = size, 0
            return
        self._votes = self._votes + 1 if size == self._candidate else 1
        self._candidate = size
        if self._votes >= CONFIRMATIONS:
            logger.info("CPU thread team %d -> %d: other processes keep %.2f of %d cores busy",
                        self.num_threads, size, self.other_cores, len(self.cpus))
            self.set_threads(size)
            self.num_threads, self._votes = size, 0
            self.num_changes += 1


def make_thread_team(device: str, num_threads: int | None = None) -> ThreadTeam | None:
    """The engine's team, or None: off by env, a GPU engine, or no /proc to read. num_threads: the
    engine's --num-threads (the ceiling), else torch's default team size."""
    if device != "cpu" or not enabled_by_env():
        return None
    try:
        return ThreadTeam(num_threads or DEFAULT_MAX_THREADS)
    except (OSError, ValueError, IndexError) as error:   # no /proc/stat (not Linux), a sandbox hiding it
        logger.info("thread team adaptation off: %s", error)
        return None
