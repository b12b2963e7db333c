"""NcclCommunicatorAdapter: the CUDA tensor-parallel all-reduce (ops/nccl.py's NcclCommunicator over
libnccl.so.2) behind the Communicator interface. Importable without CUDA; opening one needs a CUDA build
of pagedcore._core and a GPU per rank.

    spec = create_nccl_group(world_size=2)                      # driver (needs libnccl to make the id)
    comm = open_communicator(spec, rank, device=torch.device("cuda", rank))
    comm.all_reduce(hidden)                                      # on the device's current stream
"""

from __future__ import annotations

import torch

from pagedcore.distributed.communicator import Communicator

__all__ = ["NcclCommunicatorAdapter", "new_unique_id"]


def new_unique_id() -> bytes:
    """A fresh NCCL unique id (128 bytes), made once by whoever creates the group."""
    from pagedcore.ops.nccl import NcclCommunicator

    return NcclCommunicator.get_unique_id()


class NcclCommunicatorAdapter(Communicator):
    """One rank of an NCCL group. Joining blocks until every rank of the group has joined."""

    def __init__(self, world_size: int, rank: int, unique_id: bytes, *, device: torch.device | str | None = None,
                 **_options):
        # _options: timeout / is_alive of the CPU communicators; NCCL has its own (NCCL_TIMEOUT) and no
        # liveness hook, so a dead peer surfaces as an NCCL error or the executor's own check.
        from pagedcore.ops.nccl import NcclCommunicator

        self._comm = NcclCommunicator(world_size, rank, unique_id, device=device)
        self.rank = rank
        self.world_size = world_size
        self.device = self._comm.device

    def all_reduce(self, tensor: torch.Tensor) -> None:
        if self._comm is None:
            raise RuntimeError("all_reduce on a closed NcclCommunicatorAdapter")
        self._comm.all_reduce(tensor)

    def close(self) -> None:
        if self._comm is not None:
            self._comm.destroy()
            self._comm = None
