"""engine/thread_team.py: the CPU thread team follows the cores other processes leave free.

Driven by a fake clock and fake CPU times (deterministic: no real load, no timing), plus one read of
the real /proc files and the engine's wiring. Its speed effect is a benchmark
(bench/bench_cpu_contention.py), not a test."""

from __future__ import annotations

import time

import pytest

from pagedcore.engine import thread_team as tt

TICKS = 100   # clock ticks per second, as Linux's USER_HZ


class FakeMachine:
    """Two CPUs; `others` and `own` are the cores' worth of work done per second by other processes
    and by this one; advance() moves the clock and the counters."""

    def __init__(self, cpus: int = 2):
        self.cpus = set(range(cpus))
        self.now, self.busy, self.own = 0.0, 0, 0
        self.others_rate, self.own_rate = 0.0, 2.0
        self.sizes: list[int] = []

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.busy += (self.others_rate + self.own_rate) * seconds * TICKS
        self.own += self.own_rate * seconds * TICKS

    def team(self, max_threads: int | None = None) -> tt.ThreadTeam:
        return tt.ThreadTeam(max_threads or len(self.cpus), cpus=self.cpus, interval_s=0.5,
                             read_times=lambda cpus: (self.busy, self.own), set_threads=self.sizes.append,
                             clock=lambda: self.now, ticks_per_s=TICKS)


def run(machine: FakeMachine, team: tt.ThreadTeam, seconds: float, step_s: float = 0.0625) -> None:
    """Steps of 1/16 s (exact in binary: the 0.5 s checks land on step boundaries)."""
    for _ in range(round(seconds / step_s)):
        machine.advance(step_s)
        team.on_step()


def test_a_quiet_machine_keeps_the_whole_team_and_reads_only_per_interval():
    m = FakeMachine()
    reads = []
    team = m.team()
    team.read_times = lambda cpus: reads.append(1) or (m.busy, m.own)
    m.others_rate = 0.1                      # daemons, the shell
    run(m, team, 5.0)
    assert m.sizes == [2] and team.num_threads == 2       # the first step sets the whole team, once
    assert len(reads) == 10                  # every 0.5 s, not every step (80 steps ran)
    assert team.other_cores == pytest.approx(0.1, abs=0.02)


def test_a_busy_core_shrinks_the_team_after_two_samples_and_it_grows_back():
    m = FakeMachine()
    team = m.team()
    run(m, team, 1.0)
    m.others_rate, m.own_rate = 1.0, 1.0     # a busy loop takes a core (our team shares the other)
    run(m, team, 0.5)
    assert m.sizes == [2]                    # one sample is not enough
    run(m, team, 0.5)
    assert m.sizes == [2, 1] and team.num_threads == 1
    run(m, team, 3.0)                        # stays small while the other process runs
    assert m.sizes == [2, 1]
    m.others_rate = 0.0                      # it stopped: our one thread is all that runs
    run(m, team, 1.0)
    assert m.sizes == [2, 1, 2] and team.num_threads == 2 and team.num_changes == 2


def test_a_one_sample_blip_changes_nothing():
    m = FakeMachine()
    team = m.team()
    run(m, team, 1.0)
    m.others_rate = 1.5
    run(m, team, 0.5)
    m.others_rate = 0.0
    run(m, team, 2.0)
    assert m.sizes == [2]


@pytest.mark.parametrize("cpus,max_threads,others,size", [
    (2, 2, 0.0, 2), (2, 2, 0.3, 2), (2, 2, 0.7, 1), (2, 2, 1.0, 1), (2, 2, 2.0, 1),
    (16, 16, 3.2, 13), (16, 16, 3.7, 12), (16, 8, 3.0, 8),   # an explicit --num-threads is the ceiling
])
def test_size_for_takes_the_cores_others_keep_busy(cpus, max_threads, others, size):
    assert FakeMachine(cpus).team(max_threads).size_for(others) == size


def test_reads_the_real_proc_files():
    cpus = set(tt.os.sched_getaffinity(0))
    busy0, own0 = tt.read_cpu_times(cpus)
    end = time.process_time() + 0.05
    while time.process_time() < end:          # burn 50 ms of this process's CPU
        pass
    busy1, own1 = tt.read_cpu_times(cpus)
    assert own1 > own0 and busy1 >= busy0 + (own1 - own0) // 2


def test_the_engine_has_a_team_by_default_and_the_env_turns_it_off(tiny_llama, monkeypatch):
    import torch

    from pagedcore import LLM

    _, folder = tiny_llama
    monkeypatch.delenv(tt.ENV_VAR, raising=False)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)    # as another engine's shrunk team leaves it: the ceiling stays torch's default
        engine = LLM(folder, max_model_len=64, kv_cache_memory="4MiB").llm_engine
        assert isinstance(engine.thread_team, tt.ThreadTeam)
        assert engine.thread_team.max_threads == min(tt.DEFAULT_MAX_THREADS, len(tt.os.sched_getaffinity(0)))
        assert LLM(folder, max_model_len=64, kv_cache_memory="4MiB", num_threads=1).llm_engine.thread_team.max_threads == 1
    finally:
        torch.set_num_threads(before)
    monkeypatch.setenv(tt.ENV_VAR, "0")
    assert LLM(folder, max_model_len=64, kv_cache_memory="4MiB").llm_engine.thread_team is None


def test_shrinking_reaches_torch_and_our_kernels_on_the_stepping_thread():
    import torch

    from pagedcore import _core

    before, threading = torch.get_num_threads(), _core.kernel_threading()
    _core.set_kernel_threading("openmp")   # (an engine built earlier may have left the pool: ops/kernel_threading.py)
    if before < 2 or _core.kernel_threading() != "openmp":
        _core.set_kernel_threading(threading)
        pytest.skip("needs 2+ threads and a build with OpenMP")
    m = FakeMachine(before)
    team = tt.ThreadTeam(before, cpus=m.cpus, interval_s=0.5, read_times=lambda cpus: (m.busy, m.own),
                         clock=lambda: m.now, ticks_per_s=TICKS)   # the real torch.set_num_threads
    try:
        m.others_rate, m.own_rate = float(before), 1.0   # every core taken: the team of one
        run(m, team, 1.0)
        assert team.num_threads == 1
        assert torch.get_num_threads() == 1 and _core.kernel_max_threads() == 1
        m.others_rate = 0.0
        run(m, team, 1.0)
        assert torch.get_num_threads() == before and _core.kernel_max_threads() == before
    finally:
        torch.set_num_threads(before)
        _core.set_kernel_threading(threading)


def test_the_kernels_pool_follows_torch_threads_too():
    """--num-threads and the thread team reach the kernels' pool (PAGEDCORE_KERNEL_THREADING=pool, or the
    one-call decode under PAGEDCORE_DECODE_THREADING=pool), not only OpenMP."""
    import torch

    from pagedcore import _core

    before, threading = torch.get_num_threads(), _core.kernel_threading()
    if before < 2:
        pytest.skip("needs 2+ threads")
    try:
        _core.set_kernel_threading("pool")
        assert _core.kernel_max_threads() == before
        torch.set_num_threads(1)
        assert _core.kernel_max_threads() == 1
    finally:
        torch.set_num_threads(before)
        _core.set_kernel_threading(threading)


def test_decode_threading_is_a_switch_with_four_positions():
    from pagedcore import _core

    saved = _core.decode_threading()
    try:
        for name in ("pool", "openmp", "inherit", "auto"):
            _core.set_decode_threading(name)
            assert _core.decode_threading() == name
        with pytest.raises(ValueError, match="'auto', 'inherit', 'openmp' or 'pool'"):
            _core.set_decode_threading("fibers")
    finally:
        _core.set_decode_threading(saved)
