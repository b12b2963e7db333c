"""The entry of an mp worker process: bind to its cores, open its channels, then serve steps.

A rank never outlives its driver. Three guards, because a rank can be stuck in different places when
the driver goes: its waits pass is_alive (the driver's pid is still its parent), a watchdog thread
checks the same a few times a second (a rank blocked somewhere that does not poll), and the kernel
sends it SIGKILL when the thread that spawned it ends (PR_SET_PDEATHSIG; the executor spawns from a
thread that lives as long as the executor, see mp_executor.py), which also covers a rank spinning in
native code that holds the GIL.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import threading
import time

PR_SET_PDEATHSIG = 1
WATCHDOG_PERIOD_S = 0.25


def _die_with_parent(driver_pid: int) -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except OSError:   # not glibc Linux: the watchdog below still ends the rank
        pass
    if os.getppid() != driver_pid:    # the driver died before prctl took effect
        os._exit(0)

    def watch() -> None:
        while os.getppid() == driver_pid:
            time.sleep(WATCHDOG_PERIOD_S)
        os._exit(0)

    threading.Thread(target=watch, name="pagedcore-rank-watchdog", daemon=True).start()


def bind_cores(cores: tuple[int, ...] | None, num_threads: int) -> None:
    """This process on its cores only, with one torch / kernel thread per core: ranks on one machine
    must not oversubscribe it (an OpenMP team bigger than its cores stalls every all-reduce)."""
    import torch

    if cores:
        os.sched_setaffinity(0, cores)
    torch.set_num_threads(max(1, num_threads))


def rank_main(init, driver_pid: int, log_level: int = logging.WARNING) -> None:
    """multiprocessing target (spawn): init is a RankInit."""
    _die_with_parent(driver_pid)
    logging.basicConfig(level=log_level, format=f"%(asctime)s rank {init.rank} %(levelname)s %(name)s: %(message)s")
    bind_cores(init.cores, init.num_threads)
    from pagedcore.distributed import comm_spec
    from pagedcore.distributed.rank_worker import RankWorker

    def driver_alive() -> bool:
        return os.getppid() == driver_pid

    step_reader = comm_spec.open_channel_reader(init.step_channel, init.rank)
    try:
        worker = RankWorker(init, is_alive=driver_alive)   # opens the tp group and stage channels
    except BaseException as error:  # noqa: BLE001 - told to the driver, then exit non-zero
        _report_failure(init, error)
        os._exit(1)
    try:
        worker.serve_forever(step_reader, is_alive=driver_alive)
    finally:
        worker.close()
        step_reader.close()
    # Skips the interpreter's teardown (freeing a model's tensors and torch's state one object at a
    # time took seconds under load): the rank holds nothing that needs it. Logs are flushed first.
    logging.shutdown()
    os._exit(0)


def _report_failure(init, error: BaseException) -> None:
    import traceback

    from pagedcore.distributed import comm_spec
    from pagedcore.distributed.rank_worker import RankFailure

    logging.getLogger(__name__).error("rank %d could not start: %s", init.rank, traceback.format_exc())
    if init.result_channel is not None:
        try:
            comm_spec.open_channel_writer(init.result_channel).put(
                RankFailure(init.rank, f"{type(error).__name__}: {error}", traceback.format_exc()), timeout=5.0)
        except Exception:  # noqa: BLE001 - the exit status still tells the driver
            pass
