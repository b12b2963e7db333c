"""Picklable descriptions of communication groups and channels, and the functions that create them
(in the engine process) and open one end of them (in each rank). A spec travels to a worker inside
its RankInit; the worker calls open_communicator / open_channel_reader / open_channel_writer.

    spec = create_shm_group(world_size=2, max_bytes=4 << 20)    # driver
    comm = open_communicator(spec, rank=tp_rank)                # each rank of the group
    step = create_shm_channel(num_readers=2)                    # driver
    writer = open_channel_writer(step); reader = open_channel_reader(step, reader_index=rank)

Shared memory on one machine, gloo (torch.distributed) across machines. Shared-memory names are
unique (pagedcore-<pid>-<counter>-<random>); the name is unlinked as soon as every end has opened it,
else by release(spec) / at exit of the creating process, and create_* removes the leftovers of
crashed runs (segments whose creating pid is gone), so /dev/shm never fills up with them."""

from __future__ import annotations

import atexit
import itertools
import os
import secrets
import socket
import threading
from dataclasses import dataclass

from pagedcore import _core
from pagedcore.distributed.communicator import Channel, Communicator

__all__ = [
    "ShmGroupSpec", "GlooGroupSpec", "NcclGroupSpec", "ShmChannelSpec", "GlooChannelSpec",
    "create_shm_group", "create_shm_channel", "create_gloo_group", "create_gloo_channel", "create_nccl_group",
    "open_communicator", "open_channel_writer", "open_channel_reader", "release", "shm_names_of",
    "DEFAULT_ALL_REDUCE_BYTES", "DEFAULT_CHANNEL_BYTES",
]

DEFAULT_ALL_REDUCE_BYTES = 4 << 20   # per rank and round; larger tensors take several rounds
DEFAULT_CHANNEL_BYTES = 16 << 20     # larger values stream through the ring in pieces
_PREFIX = "pagedcore-"


@dataclass(frozen=True)
class ShmGroupSpec:
    name: str            # /dev/shm/<name>
    world_size: int
    max_bytes: int       # all-reduce buffer per rank (one round)


@dataclass(frozen=True)
class GlooGroupSpec:
    init_method: str                 # "tcp://host:port" (group rank 0 hosts the store there) or "file:///path"
    world_size: int
    group_ranks: tuple[int, ...]     # the global ranks of the group, in group-rank order (for messages)


@dataclass(frozen=True)
class NcclGroupSpec:
    unique_id: bytes                 # NCCL's 128-byte id (ops.nccl.NcclCommunicator.get_unique_id)
    world_size: int


@dataclass(frozen=True)
class ShmChannelSpec:
    name: str
    num_readers: int
    capacity_bytes: int


@dataclass(frozen=True)
class GlooChannelSpec:
    init_method: str      # as GlooGroupSpec: the writer is group rank 0 and hosts a tcp store
    num_readers: int      # readers are group ranks 1 .. num_readers
    max_in_flight: int = 8   # values put and not yet read by every reader before put() waits


# ---- creating (the engine process) ----

_counter = itertools.count()
_created: dict[str, int] = {}        # shm name -> pid that created it (a forked child inherits the dict)
_lock = threading.Lock()


def _new_name() -> str:
    return f"{_PREFIX}{os.getpid()}-{next(_counter)}-{secrets.token_hex(4)}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True


def remove_stale_segments(shm_dir: str = "/dev/shm") -> list[str]:
    """Unlinks pagedcore-<pid>-* segments whose creating process is gone (a crashed run's); returns them."""
    removed = []
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(_PREFIX):
            continue
        pid_text = name[len(_PREFIX):].split("-", 1)[0]
        if pid_text.isdigit() and not _pid_alive(int(pid_text)):
            if _core.shm_unlink(name):
                removed.append(name)
    return removed


def _create_segment(create, count_name: str, count: int, bytes_name: str, nbytes: int) -> str:
    """Checks the sizes, clears segments of dead processes, then create(name, count, nbytes) under a
    new name recorded as this process's (so it is unlinked when we exit). Returns the name."""
    if count < 1:
        raise ValueError(f"{count_name} must be >= 1, got {count}")
    if nbytes < 64:
        raise ValueError(f"{bytes_name} must be >= 64, got {nbytes}")
    remove_stale_segments()
    name = _new_name()
    create(name, count, nbytes)
    with _lock:
        _created[name] = os.getpid()
    return name


def create_shm_group(world_size: int, max_bytes: int = DEFAULT_ALL_REDUCE_BYTES) -> ShmGroupSpec:
    """A shared-memory all-reduce group of `world_size` ranks on this machine; `max_bytes` is the
    buffer per rank (tensors above it are reduced in several rounds)."""
    name = _create_segment(_core.ShmAllReduce.create, "world_size", world_size, "max_bytes", max_bytes)
    return ShmGroupSpec(name=name, world_size=world_size, max_bytes=max_bytes)


def create_shm_channel(num_readers: int, capacity_bytes: int = DEFAULT_CHANNEL_BYTES) -> ShmChannelSpec:
    """A shared-memory channel with one writer and `num_readers` readers on this machine."""
    name = _create_segment(_core.ShmRing.create, "num_readers", num_readers, "capacity_bytes", capacity_bytes)
    return ShmChannelSpec(name=name, num_readers=num_readers, capacity_bytes=capacity_bytes)


def free_tcp_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def create_gloo_group(world_size: int, host: str = "127.0.0.1", port: int | None = None,
                      group_ranks: tuple[int, ...] | None = None) -> GlooGroupSpec:
    """A gloo group; group rank 0 must run on `host` (it hosts the rendezvous store on `port`, by
    default a port free here: pass one free on that host when rank 0 runs elsewhere)."""
    port = free_tcp_port(host) if port is None else port
    ranks = tuple(range(world_size)) if group_ranks is None else tuple(group_ranks)
    if len(ranks) != world_size:
        raise ValueError(f"group_ranks {ranks} must name world_size={world_size} ranks")
    return GlooGroupSpec(init_method=f"tcp://{host}:{port}", world_size=world_size, group_ranks=ranks)


def create_gloo_channel(num_readers: int, host: str = "127.0.0.1", port: int | None = None,
                        max_in_flight: int = 8) -> GlooChannelSpec:
    """A gloo channel; its writer must run on `host` (it hosts the store on `port`)."""
    port = free_tcp_port(host) if port is None else port
    return GlooChannelSpec(init_method=f"tcp://{host}:{port}", num_readers=num_readers, max_in_flight=max_in_flight)


def create_nccl_group(world_size: int) -> NcclGroupSpec:
    """An NCCL group for CUDA tensors (one GPU per rank); needs libnccl.so.2 here to make the id."""
    from pagedcore.distributed.nccl_communicator import new_unique_id

    return NcclGroupSpec(unique_id=new_unique_id(), world_size=world_size)


def shm_names_of(spec) -> list[str]:
    return [spec.name] if isinstance(spec, (ShmGroupSpec, ShmChannelSpec)) else []


def release(spec) -> None:
    """The creator's cleanup: unlinks a shared-memory spec's name if it is still there (ends already
    open keep working). Idempotent; nothing to do for gloo specs."""
    for name in shm_names_of(spec):
        _core.shm_unlink(name)
        with _lock:
            _created.pop(name, None)


@atexit.register
def _release_all() -> None:
    with _lock:
        names = [name for name, pid in _created.items() if pid == os.getpid()]
        _created.clear()
    for name in names:
        _core.shm_unlink(name)


# ---- opening one end (each rank) ----

def open_communicator(spec, rank: int, **options) -> Communicator:
    """This rank's end of the group `spec` (rank: its index inside the group). Options: timeout
    (seconds, None: none), is_alive (a callable, False once a peer is known gone); NCCL: device."""
    if not 0 <= rank < spec.world_size:
        raise ValueError(f"rank {rank} is outside a group of {spec.world_size}")
    if isinstance(spec, ShmGroupSpec):
        from pagedcore.distributed.shm_communicator import ShmCommunicator
        return ShmCommunicator(spec.name, rank, **options)
    if isinstance(spec, GlooGroupSpec):
        from pagedcore.distributed.gloo import GlooCommunicator
        return GlooCommunicator(spec, rank, **options)
    if isinstance(spec, NcclGroupSpec):
        from pagedcore.distributed.nccl_communicator import NcclCommunicatorAdapter
        return NcclCommunicatorAdapter(spec.world_size, rank, spec.unique_id, **options)
    raise TypeError(f"open_communicator: unknown spec {spec!r}")


def open_channel_writer(spec, **options) -> Channel:
    if isinstance(spec, ShmChannelSpec):
        from pagedcore.distributed.shm_channel import ShmChannel
        return ShmChannel(spec.name, None, **options)
    if isinstance(spec, GlooChannelSpec):
        from pagedcore.distributed.gloo import GlooChannel
        return GlooChannel(spec, None, **options)
    raise TypeError(f"open_channel_writer: unknown spec {spec!r}")


def open_channel_reader(spec, reader_index: int, **options) -> Channel:
    if not 0 <= reader_index < spec.num_readers:
        raise ValueError(f"reader_index {reader_index} is outside a channel of {spec.num_readers} readers")
    if isinstance(spec, ShmChannelSpec):
        from pagedcore.distributed.shm_channel import ShmChannel
        return ShmChannel(spec.name, reader_index, **options)
    if isinstance(spec, GlooChannelSpec):
        from pagedcore.distributed.gloo import GlooChannel
        return GlooChannel(spec, reader_index, **options)
    raise TypeError(f"open_channel_reader: unknown spec {spec!r}")
