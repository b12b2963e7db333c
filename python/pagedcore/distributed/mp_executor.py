"""MPExecutor: tp x pp ranks as worker processes on this machine (--distributed-executor-backend mp).

    driver (engine process: scheduler, sampler, front ends; runs no layer)
      │ step channel: each StepInput put once, read by every rank (reader index = rank)
      ├──▶ rank 0 (pp 0, tp 0) ═╗ tp group: all-reduce     one result channel per rank back to the
      ├──▶ rank 1 (pp 0, tp 1) ═╝                         driver: call replies; on the last stage the
      │        │ stage channels (p, t) ─▶ (p + 1, t)       logits slice of each step
      └──▶ ranks of the last stage ──fp32 [rows, vocab slice]──▶ driver concatenates in tp_rank order

Channels and groups are shared memory (comm_spec.py: no sockets on the hot path). Processes start with the `spawn` method (no fork of a
threaded driver) from a spawner thread that lives as long as the executor: the ranks die with that
thread (PR_SET_PDEATHSIG), so a driver that is killed leaves no orphan. Every wait on a rank checks
that all ranks are alive; one that is not turns into WorkerDiedError within a poll period (0.1 s),
and the survivors are stopped at once (the model cannot run with a shard missing).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
import weakref

import numpy as np
import torch

from pagedcore.config import EngineConfig
from pagedcore.distributed import comm_spec
from pagedcore.distributed.errors import PeerDiedError, WorkerDiedError
from pagedcore.distributed.executor import Executor
from pagedcore.distributed.parallel_config import core_plan
from pagedcore.distributed.rank_worker import RankCall, RankFailure, RankInit, RankReply
from pagedcore.engine import kv_cache as kvc
from pagedcore.engine.step_input import StepInput
from pagedcore.model_config import ModelConfig

logger = logging.getLogger(__name__)

STOP_GRACE_S = 5.0        # a stopped rank that has not exited by then is killed
FAILURE_DRAIN_S = 1.0     # how long to look for a dead rank's last words (its RankFailure)
CULPRIT_WAIT_S = 2.0      # how long a peer's "rank died" may precede the rank being reapable


class MPExecutor(Executor):
    """Not thread-safe, like LLMEngine: one thread makes every call (memory reports are cached once
    the cache is allocated, so other threads may read those)."""

    def __init__(self, config: EngineConfig, model_config: ModelConfig):
        super().__init__(config, model_config)
        layout = self.layout
        world = layout.world_size
        on_gpu = torch.device(config.device).type == "cuda"
        # CPU ranks: their own cores (more ranks than cores is a start-up error, before anything is
        # created). CUDA ranks: rank r on GPU r, host threads left where they are.
        cores = [None] * world if on_gpu else core_plan(world)
        self._ctx = multiprocessing.get_context("spawn")
        self._factory = make = _ChannelFactory(config, model_config, layout)
        self._step_spec = make.step_channel(world)
        self._result_specs = [make.result_channel(rank) for rank in range(world)]
        stage_specs = {(p, t): make.stage_channel() for p in range(layout.pp_size - 1) for t in range(layout.tp_size)}
        tp_groups = [make.tp_group(layout.tp_size, nccl=on_gpu) if layout.tp_size > 1 else None
                     for _ in range(layout.pp_size)]
        inits = []
        for rank in range(world):
            info = layout.rank_info(rank)
            p, t = info.pp_rank, info.tp_rank
            inits.append(RankInit(
                model=config.model, dtype=config.dtype, quantization=config.quantization,
                block_size=config.block_size, rank=rank, layout=layout, tp_group=tp_groups[p],
                step_channel=self._step_spec, result_channel=self._result_specs[rank],
                prev_stage_channel=stage_specs.get((p - 1, t)), next_stage_channel=stage_specs.get((p, t)),
                cores=cores[rank], num_threads=len(cores[rank]) if cores[rank] else 1, seed=config.seed,
                device="cuda" if on_gpu else "cpu"))
        from pagedcore.distributed.worker_main import rank_main

        log_level = logging.getLogger().getEffectiveLevel()
        self._procs = [self._ctx.Process(target=rank_main, args=(init, os.getpid(), log_level), daemon=True,
                                         name=f"pagedcore-rank-{init.rank}") for init in inits]
        self._spawner = _Spawner(self._procs)
        self._error: WorkerDiedError | None = None
        self._closed = False
        self._answered = False   # some call came back: the ranks got past their start-up
        self._memory_reports: list[dict] | None = None   # per rank, once the KV cache is allocated
        self._step_writer = comm_spec.open_channel_writer(self._step_spec)
        self._results = [comm_spec.open_channel_reader(spec, 0) for spec in self._result_specs]
        self._last_stage_ranks = layout.stage_ranks(layout.pp_size - 1)
        # Reaps the ranks if the executor is dropped without shutdown() (or at interpreter exit).
        self._finalizer = weakref.finalize(self, _reap, self._procs, self._spawner, self._factory, self._step_writer)
        self._spawner.start_all()
        logger.info("started %d rank(s) (tp %d x pp %d) with pids %s on cores %s", world, layout.tp_size,
                    layout.pp_size, [p.pid for p in self._procs], cores)

    # -- Worker ----------------------------------------------------------------------------------------
    def load_model(self) -> None:
        replies = self._call("load_model")
        logger.info("ranks loaded their shards: %s MiB of weights", [round(b / 2**20, 1) for b in replies])

    def profile_num_blocks(self, shape: kvc.ProfileShape) -> int:
        """CUDA ranks: the KV blocks every GPU can hold after a profiled forward of the largest step (the
        fewest over the ranks: one block id means a block on every rank)."""
        replies = self._call("profile_memory", shape)
        return min(kvc.gpu_kv_cache_budget(self.config, total, peak, shape) // block_bytes
                   for total, peak, block_bytes in replies)

    def init_kv_cache(self, spec: kvc.KVCacheSpec, num_blocks: int, num_cpu_blocks: int,
                      background_commit: bool = False) -> None:
        """spec: the engine's (unused: each rank allocates num_blocks of its own heads and layers)."""
        self._call("init_kv_cache", num_blocks, num_cpu_blocks, background_commit)
        # Fixed from here on: asked once, so readers on other threads never send a call between steps.
        self._memory_reports = self._call("memory_report")
        self.num_parameters = sum(r["num_parameters"] for r in self._memory_reports)

    def execute_step(self, step: StepInput) -> torch.Tensor:
        self._raise_if_dead()
        try:
            self._step_writer.put(step, is_alive=self._all_alive)
            slices = [self._get(rank) for rank in self._last_stage_ranks]   # fp32 [rows, vocab slice] each
        except PeerDiedError as error:
            raise self._died(cause=error) from None
        for rank, value in zip(self._last_stage_ranks, slices):
            if isinstance(value, RankFailure):
                raise self._died(rank, value) from None
        logits = slices[0] if len(slices) == 1 else np.concatenate(slices, axis=1)
        return torch.from_numpy(logits)                                      # fp32 [rows, vocab]

    def rank_memory_reports(self) -> list[dict]:
        return self._memory_reports if self._memory_reports is not None else self._call("memory_report")

    # -- health and shutdown ------------------------------------------------------------------------------
    def check_health(self) -> None:
        self._raise_if_dead()
        if not self._all_alive():
            raise self._died()

    @property
    def pids(self) -> list[int | None]:
        return [p.pid for p in self._procs]

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._finalizer()   # stops and joins (then kills) the ranks, ends the spawner thread, releases channels
        self._close_ends()

    # -- internals -------------------------------------------------------------------------------------------
    def _all_alive(self) -> bool:
        return all(p.is_alive() for p in self._procs)

    def _get(self, rank: int):
        return self._results[rank].get(is_alive=self._all_alive)

    def _call(self, method: str, *args) -> list:
        """Runs RankWorker.<method>(*args) on every rank; their return values in rank order."""
        self._raise_if_dead()
        try:
            self._step_writer.put(RankCall(method, args), is_alive=self._all_alive)
            replies = [self._get(rank) for rank in range(self.layout.world_size)]
        except PeerDiedError as error:
            raise self._died(cause=error) from None
        for rank, reply in enumerate(replies):
            if isinstance(reply, RankFailure):
                raise self._died(rank, reply, during=method) from None
        self._answered = True
        return [reply.value for reply in replies if isinstance(reply, RankReply)]

    def _raise_if_dead(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise WorkerDiedError("the executor was shut down; its ranks are gone")

    def _died(self, rank: int | None = None, failure: RankFailure | None = None,
              during: str = "a step", cause: BaseException | None = None) -> WorkerDiedError:
        """The WorkerDiedError for the first rank found dead (or the one that reported failure), after
        stopping every other rank: the engine cannot run a step with a shard missing."""
        if rank is None:
            rank = self._culprit()
        proc = self._procs[rank]
        if failure is None:
            failure = self._last_words(rank)
        proc.join(FAILURE_DRAIN_S if failure is not None else 0.2)
        how = _how_it_ended(proc.exitcode)
        text = f"worker rank {rank} (pid {proc.pid}) died: {how}"
        if proc.exitcode is None and cause is not None:   # no rank found dead: say what the wait saw
            text = f"a worker rank is gone ({cause}); rank {rank} (pid {proc.pid}) is still running"
        if failure is None and proc.exitcode == 1 and not self._answered:
            # A spawned rank imports the main module first: an unguarded script starts the engine again there.
            text += ("; it failed before starting (its error is in the output above). In a script, put the "
                     "code that builds the engine under `if __name__ == \"__main__\":`: ranks are spawned "
                     "processes that import the main module")
        if failure is not None:
            text = f"worker rank {rank} (pid {proc.pid}) failed during {during}: {failure.message} ({how})"
        self._error = WorkerDiedError(text)
        logger.error("%s; stopping the other ranks", text)
        self._closed = True
        for p in self._procs:   # no grace: they may be waiting on the dead rank in a collective
            if p.pid is not None and p.is_alive():
                p.kill()
        self._finalizer()
        self._close_ends()
        return self._error

    def _close_ends(self) -> None:
        """The driver's own ends of the channels (their shared memory is unmapped)."""
        for end in (self._step_writer, *self._results):
            end.close()

    def _culprit(self) -> int:
        """The rank to blame for a PeerDiedError: one killed by a signal or failed (non-zero status)
        before one that exited because a peer was gone (status 0). A SIGKILLed process takes a moment
        to become reapable after a peer's liveness check has seen it die: wait for that a little."""
        deadline = time.monotonic() + CULPRIT_WAIT_S
        while True:
            dead = [r for r, p in enumerate(self._procs) if not p.is_alive()]
            failed = [r for r in dead if self._procs[r].exitcode != 0]
            if failed or (dead and time.monotonic() >= deadline):
                return (failed or dead)[0]
            if time.monotonic() >= deadline:
                return 0
            time.sleep(0.02)

    def _last_words(self, rank: int) -> RankFailure | None:
        try:
            value = self._results[rank].get(timeout=FAILURE_DRAIN_S)
        except (TimeoutError, PeerDiedError, OSError, EOFError):
            return None
        return value if isinstance(value, RankFailure) else None


def _how_it_ended(exitcode: int | None) -> str:
    if exitcode is None:
        return "still running, but a peer is gone"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"killed by signal {-exitcode} ({name})"
    return f"exited with status {exitcode}"


def _reap(procs, spawner, specs, step_writer) -> None:
    """Tells the ranks to stop (when all are alive: after a death the survivors were killed), joins
    them (STOP_GRACE_S), then SIGKILLs what is left; ends the spawner thread; releases the channels
    and groups (unlinks their shared memory). Runs from shutdown(), garbage collection or exit."""
    alive = [p.pid is not None and p.is_alive() for p in procs]
    if alive and all(alive):
        try:
            step_writer.put(RankCall("stop"), timeout=STOP_GRACE_S, is_alive=lambda: all(p.is_alive() for p in procs))
        except (PeerDiedError, TimeoutError, RuntimeError, OSError):
            pass   # the joins below and then SIGKILL still end them
    deadline = time.monotonic() + STOP_GRACE_S
    for p in procs:
        if p.pid is not None:
            p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.pid is not None and p.is_alive():
            logger.warning("rank process %d did not stop; killing it", p.pid)
            p.kill()
            p.join(2.0)
    spawner.stop()
    specs.close()


class _Spawner:
    """Starts the rank processes from its own thread and keeps that thread alive until stop(): the
    ranks ask the kernel for SIGKILL when their parent thread ends (worker_main.py), and a thread
    of the engine's (the server's loading thread) may end long before the engine does."""

    def __init__(self, procs):
        self._procs = procs
        self._started = threading.Event()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="pagedcore-rank-spawner", daemon=True)

    def _run(self) -> None:
        try:
            for p in self._procs:
                p.start()
        except BaseException as error:  # noqa: BLE001 - re-raised on the caller's thread
            self._error = error
        finally:
            self._started.set()
        self._stop.wait()

    def start_all(self) -> None:
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5.0)


class _ChannelFactory:
    """Creates the executor's shared-memory channels and groups (comm_spec.py), and releases them
    at the end. Values larger than a ring stream through it in pieces, so the capacities only need
    to hold the common case without the writer waiting."""

    def __init__(self, config: EngineConfig, model_config: ModelConfig, layout):
        self._created: list = []
        tokens = config.max_num_batched_tokens or 2048
        elem = model_config.torch_dtype.itemsize
        # One micro-batch's hidden + residual [tokens, hidden]; every micro-batch of a step may be in flight.
        stage_bytes = 2 * tokens * model_config.hidden_size * elem + (64 << 10)
        self.stage_capacity = min(max(layout.pp_size * stage_bytes, 1 << 20), 4 * comm_spec.DEFAULT_CHANNEL_BYTES)

    def _keep(self, spec):
        self._created.append(spec)
        return spec

    def step_channel(self, world: int):
        return self._keep(comm_spec.create_shm_channel(world, comm_spec.DEFAULT_CHANNEL_BYTES))

    def result_channel(self, rank: int):
        return self._keep(comm_spec.create_shm_channel(1, comm_spec.DEFAULT_CHANNEL_BYTES))

    def stage_channel(self):
        return self._keep(comm_spec.create_shm_channel(1, self.stage_capacity))

    def tp_group(self, tp_size: int, nccl: bool = False):
        if nccl:   # CUDA ranks: the all-reduce runs on the GPUs (NCCL), nothing to unlink
            return comm_spec.create_nccl_group(tp_size)
        return self._keep(comm_spec.create_shm_group(tp_size, comm_spec.DEFAULT_ALL_REDUCE_BYTES))

    def close(self) -> None:
        for spec in self._created:
            comm_spec.release(spec)
        self._created.clear()
