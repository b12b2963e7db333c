"""RayExecutor: the model's ranks as Ray actors (--distributed-executor-backend ray), placed by one
placement group with a bundle per rank, on the cluster this process joins (ray_cluster.py).

    driver (engine process: scheduler, sampler, front ends)
      │ per step: ray.put(StepInput) once, the same ObjectRef to every actor (one copy per node)
      ├──▶ actor rank 0 ═╗ tp group: shared memory when the ranks and the driver share a machine,
      ├──▶ actor rank 1 ═╝ else torch.distributed gloo (comm_spec.py)
      └──◀ each last-stage rank returns its fp32 [rows, vocab slice]; the driver concatenates

Each actor wraps the same RankWorker the mp executor runs in a process, so a rank computes the same
thing under either backend. The driver waits on all of a step's calls together and polls, so a dead
actor (RayActorError) or a rank that raised turns into WorkerDiedError within a poll period, and the
other actors are killed (peers may wait on it in an all-reduce). Pipeline parallelism is refused on
Ray: its stage activations need a channel between actors, which only the mp executor has today.
"""

from __future__ import annotations

import logging
import os
import socket
import weakref

import numpy as np
import torch

from pagedcore.config import EngineConfig
from pagedcore.distributed.errors import WorkerDiedError
from pagedcore.distributed.executor import Executor
from pagedcore.distributed.ray_cluster import join_cluster, node_ip
from pagedcore.distributed.rank_worker import RankInit
from pagedcore.engine import kv_cache as kvc
from pagedcore.engine.step_input import StepInput
from pagedcore.model_config import ModelConfig

logger = logging.getLogger(__name__)

RANK_CPUS = int(os.environ.get("PAGEDCORE_RAY_CPUS_PER_RANK", "1"))   # CPUs in each rank's bundle
PLACEMENT_TIMEOUT_S = 60.0   # the cluster has that long to find room for every bundle
POLL_S = 0.2                 # how often a wait looks for dead actors


class _RankActor:
    """One rank inside a Ray worker process (wrapped by ray.remote in RayExecutor)."""

    def __init__(self):
        self.worker = None

    def where(self) -> tuple[str, int]:
        """(node address, pid): the driver decides shared memory vs gloo from where the ranks landed."""
        return node_ip(), os.getpid()

    def free_port(self) -> int:
        with socket.socket() as s:
            s.bind(("", 0))
            return s.getsockname()[1]

    def start(self, init: RankInit) -> None:
        torch.set_num_threads(max(1, init.num_threads))
        from pagedcore.distributed.rank_worker import RankWorker

        self.worker = RankWorker(init)

    def call(self, method: str, *args):
        return getattr(self.worker, method)(*args)

    def run_step(self, step: StepInput) -> np.ndarray | None:
        return self.worker.run_step(step)    # fp32 [rows, vocab slice] on the last stage, else None


class RayExecutor(Executor):
    def __init__(self, config: EngineConfig, model_config: ModelConfig):
        super().__init__(config, model_config)
        layout = self.layout
        if layout.pp_size > 1:
            raise ValueError(f"--pipeline-parallel-size {layout.pp_size} is not supported with "
                             "--distributed-executor-backend ray yet (stage activations need a channel between "
                             "actors); use --distributed-executor-backend mp, or --pipeline-parallel-size 1")
        self._ray = ray = join_cluster()
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        world = layout.world_size
        self._error: WorkerDiedError | None = None
        self._closed = False
        self._comm_specs: list = []
        # PACK: every rank on one node when it fits (shared memory), spread over nodes when not.
        self._pg = placement_group([{"CPU": RANK_CPUS}] * world, strategy="PACK")
        self._actors: list = []
        self._finalizer = weakref.finalize(self, _release, ray, self._actors, self._pg, self._comm_specs)
        ready, _ = ray.wait([self._pg.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            free = ray.available_resources().get("CPU", 0)
            self._finalizer()
            raise ValueError(f"the Ray cluster could not place {world} rank(s) of {RANK_CPUS} CPU each within "
                             f"{PLACEMENT_TIMEOUT_S:.0f} s ({free:g} CPU(s) free); add nodes with `ray start --address "
                             "HEAD_IP:6379 --num-cpus N`, or lower --tensor-parallel-size / --data-parallel-size")
        actor_class = ray.remote(num_cpus=RANK_CPUS)(_RankActor)
        for rank in range(world):
            self._actors.append(actor_class.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=self._pg, placement_group_bundle_index=rank)).remote())
        self.places = self._wait_all([a.where.remote() for a in self._actors], "start-up")   # [(ip, pid)] by rank
        tp_group = self._tp_group() if layout.tp_size > 1 else None
        self.tp_group_specs = [tp_group] if tp_group is not None else []   # what the ranks all-reduce over
        inits = [RankInit(model=config.model, dtype=config.dtype, quantization=config.quantization,
                          block_size=config.block_size, rank=rank, layout=layout, tp_group=tp_group,
                          step_channel=None, result_channel=None, prev_stage_channel=None, next_stage_channel=None,
                          cores=None, num_threads=RANK_CPUS, seed=config.seed) for rank in range(world)]
        self._wait_all([a.start.remote(init) for a, init in zip(self._actors, inits)], "start-up")
        logger.info("started %d rank(s) as Ray actors at %s", world, self.places)

    # -- Worker --------------------------------------------------------------------------------------------
    def load_model(self) -> None:
        self._call("load_model")

    def init_kv_cache(self, spec: kvc.KVCacheSpec, num_blocks: int, num_cpu_blocks: int,
                      background_commit: bool = False) -> None:
        """spec: the engine's (unused: each rank allocates num_blocks of its own heads)."""
        self._call("init_kv_cache", num_blocks, num_cpu_blocks, background_commit)
        self.num_parameters = sum(r["num_parameters"] for r in self.rank_memory_reports())

    def execute_step(self, step: StepInput) -> torch.Tensor:
        self._raise_if_dead()
        step_ref = self._ray.put(step)    # once; every actor reads the same object
        values = self._wait_all([a.run_step.remote(step_ref) for a in self._actors], "a step")
        last = self.layout.stage_ranks(self.layout.pp_size - 1)
        slices = [values[r] for r in last]                                  # fp32 [rows, vocab slice] each
        # One slice arrives read-only (a zero-copy view of the object store); the sampler writes in place.
        logits = np.array(slices[0]) if len(slices) == 1 else np.concatenate(slices, axis=1)
        return torch.from_numpy(logits)                                     # fp32 [rows, vocab]

    def rank_memory_reports(self) -> list[dict]:
        return self._call("memory_report")

    # -- health and shutdown --------------------------------------------------------------------------------
    @property
    def pids(self) -> list[int]:
        return [pid for _, pid in self.places]

    def check_health(self) -> None:
        self._raise_if_dead()
        self._wait_all([a.where.remote() for a in self._actors], "a health check")

    def shutdown(self) -> None:
        self._closed = True
        self._finalizer()

    # -- internals --------------------------------------------------------------------------------------------
    def _call(self, method: str, *args) -> list:
        self._raise_if_dead()
        return self._wait_all([a.call.remote(method, *args) for a in self._actors], method)

    def _wait_all(self, refs: list, during: str) -> list:
        """Every ref's value in rank order; the first failure found (any rank, not the first in order: a
        live rank may wait forever on a dead peer) becomes WorkerDiedError."""
        ray = self._ray
        rank_of = {ref: rank for rank, ref in enumerate(refs)}
        values: list = [None] * len(refs)
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
            for ref in done:
                try:
                    values[rank_of[ref]] = ray.get(ref)
                except Exception as error:  # noqa: BLE001 - RayActorError, RayTaskError, ...
                    raise self._died(rank_of[ref], error, during) from None
        return values

    def _died(self, rank: int, error: BaseException, during: str) -> WorkerDiedError:
        from ray.exceptions import RayActorError

        where = f"Ray actor, pid {self.places[rank][1]} on {self.places[rank][0]}" if getattr(self, "places", None) \
            else "Ray actor"
        cause = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
        if isinstance(error, RayActorError):
            text = f"worker rank {rank} ({where}) died during {during}: {cause}"
        else:
            text = f"worker rank {rank} ({where}) failed during {during}: {cause}"
        self._error = WorkerDiedError(text)
        logger.error("%s; stopping the other ranks", text)
        self._closed = True
        self._finalizer()       # kill every actor: the others may wait on this one in an all-reduce
        return self._error

    def _raise_if_dead(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise WorkerDiedError("the executor was shut down; its Ray actors are gone")

    def _tp_group(self):
        """Shared memory when every rank and the driver run on one machine (one node address), else gloo,
        its TCP store on rank 0's node."""
        try:
            from pagedcore.distributed import comm_spec
        except ImportError as error:
            raise ValueError(f"--tensor-parallel-size > 1 on Ray needs pagedcore.distributed.comm_spec ({error}); "
                             "rebuild with `make build`") from None
        tp = self.layout.tp_size
        ips = {ip for ip, _ in self.places}
        # PAGEDCORE_RAY_TP_TRANSPORT=gloo takes the across-machines path on one machine too (the tests
        # run it so; a cluster whose nodes report one address would need it).
        force_gloo = os.environ.get("PAGEDCORE_RAY_TP_TRANSPORT", "") == "gloo"
        if ips == {node_ip()} and not force_gloo:
            tokens = self.config.max_num_batched_tokens or 2048
            spec = comm_spec.create_shm_group(tp, tokens * self.model_config.hidden_size *
                                              self.model_config.torch_dtype.itemsize)
            self._comm_specs.append(spec)
            return spec
        port = self._wait_all([self._actors[0].free_port.remote()], "start-up")[0]
        return comm_spec.GlooGroupSpec(init_method=f"tcp://{self.places[0][0]}:{port}", world_size=tp,
                                       group_ranks=tuple(range(tp)))


def _release(ray, actors: list, pg, comm_specs: list) -> None:
    """Kills the actors, removes the placement group, releases shared memory. Idempotent."""
    from ray.util.placement_group import remove_placement_group

    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone, or the cluster is
            pass
    actors.clear()
    try:
        remove_placement_group(pg)
    except Exception:  # noqa: BLE001
        pass
    if comm_specs:
        from pagedcore.distributed import comm_spec

        release = getattr(comm_spec, "release", None)
        for spec in comm_specs:
            if release is not None:
                release(spec)
        comm_specs.clear()
