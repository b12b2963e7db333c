"""ShmCommunicator: the tensor-parallel all-reduce between rank processes on one machine, over a POSIX
shared-memory segment (cpp/distributed/shm_all_reduce.h: a slot per rank, each rank sums its share,
generation barriers). No sockets on the hot path; a dead peer raises PeerDiedError, never hangs."""

from __future__ import annotations

import torch

from pagedcore import _core
from pagedcore.distributed.communicator import Communicator, IsAlive
from pagedcore.ops.dtypes import CPU_DTYPE_CODES, dtype_code

__all__ = ["ShmCommunicator", "DEFAULT_ALL_REDUCE_TIMEOUT"]

# Peers arrive at an all-reduce within one layer's compute of each other; minutes means something is
# wrong (a peer that is alive but stuck). Dead peers are caught much sooner by the liveness checks.
DEFAULT_ALL_REDUCE_TIMEOUT = 300.0


class ShmCommunicator(Communicator):
    """One rank's end of a shared-memory group (open it with comm_spec.open_communicator).

        comm = open_communicator(spec, rank)     # spec = create_shm_group(2, max_bytes) in the driver
        comm.all_reduce(hidden)                  # hidden: CPU fp32/bf16, contiguous; summed in place
    """

    def __init__(self, name: str, rank: int, *, timeout: float | None = DEFAULT_ALL_REDUCE_TIMEOUT,
                 is_alive: IsAlive | None = None, spin_us: float | None = None):
        self._group = _core.ShmAllReduce(name, rank)
        self.rank = rank
        self.world_size = self._group.world_size
        self.timeout = timeout
        self.is_alive = is_alive
        self._spin_us = -1.0 if spin_us is None else float(spin_us)
        self._closed = False

    @property
    def slot_bytes(self) -> int:
        """Bytes one round moves per rank; larger tensors go in several rounds."""
        return self._group.slot_bytes

    def all_reduce(self, tensor: torch.Tensor) -> None:
        if self._closed:
            raise RuntimeError("all_reduce on a closed ShmCommunicator")
        if tensor.device.type != "cpu":
            raise ValueError(f"ShmCommunicator.all_reduce takes CPU tensors, got one on {tensor.device} "
                             "(CUDA tensors go through NcclCommunicatorAdapter)")
        code = dtype_code(tensor, "tensor", CPU_DTYPE_CODES, "the shared-memory all-reduce")
        if not tensor.is_contiguous():
            raise ValueError("ShmCommunicator.all_reduce needs a contiguous tensor (call .contiguous())")
        if tensor.numel() == 0 or self.world_size == 1:
            return
        timeout = -1.0 if self.timeout is None else float(self.timeout)
        self._group.all_reduce(tensor.data_ptr(), tensor.numel(), code, timeout, self.is_alive, self._spin_us)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._group.close()

    def __repr__(self) -> str:
        return f"ShmCommunicator(rank={self.rank}, world_size={self.world_size}, slot_bytes={self.slot_bytes})"
