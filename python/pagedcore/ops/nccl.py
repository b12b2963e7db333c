"""NcclCommunicator: one rank's in-place sum all-reduce of CUDA tensors for tensor parallelism, over
libnccl.so.2 loaded by pagedcore._core at run time (cuda/nccl_communicator.h)."""

from __future__ import annotations

import glob
import importlib.util
import os

import torch

from pagedcore import _core
from pagedcore.ops import checks
from pagedcore.ops.dtypes import CUDA_DTYPE_CODES, dtype_code

__all__ = ["NcclCommunicator", "nccl_library_path"]


def nccl_library_path() -> str:
    """Where libnccl.so.2 is: $PAGEDCORE_NCCL_LIBRARY, else the pip package nvidia-nccl-cu13 (or -cu12),
    else "" (the dynamic loader's own search path)."""
    env = os.environ.get("PAGEDCORE_NCCL_LIBRARY")
    if env:
        return env
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for pattern in ("nccl/lib/libnccl.so.2", "*/lib/libnccl.so.2", "**/libnccl.so.2"):
            found = sorted(glob.glob(os.path.join(root, pattern), recursive=True))
            if found:
                return found[0]
    return ""


class NcclCommunicator:
    """One rank of a tensor-parallel group: in-place sum all-reduce of CUDA tensors on the current stream.

        uid = NcclCommunicator.get_unique_id()          # rank 0; send the bytes to the other ranks
        comm = NcclCommunicator(world_size, rank, uid, device=torch.device("cuda", rank))
        comm.all_reduce(hidden)                          # hidden += the other ranks' hidden
    """

    @staticmethod
    def get_unique_id() -> bytes:
        checks.require_cuda_kernels("NcclCommunicator.get_unique_id")
        return _core.NcclCommunicator.get_unique_id(nccl_library_path())

    def __init__(self, world_size: int, rank: int, unique_id: bytes, device=None):
        checks.require_cuda_kernels("NcclCommunicator")
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device())
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"NcclCommunicator needs a CUDA device, got {device}")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self._comm = _core.NcclCommunicator(world_size, rank, unique_id, device.index, nccl_library_path())

    @property
    def world_size(self) -> int:
        return self._comm.world_size

    @property
    def rank(self) -> int:
        return self._comm.rank

    def all_reduce(self, tensor: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Sums `tensor` over the ranks into `out` (default: in place); returns the result tensor."""
        out = tensor if out is None else out
        checks.check_cuda_tensors("all_reduce", tensor=tensor, out=out)
        if tensor.device != self.device:
            raise ValueError(f"all_reduce: tensor is on {tensor.device} but this rank's device is {self.device}")
        code = dtype_code(tensor, "tensor", CUDA_DTYPE_CODES, "the CUDA kernels")
        if out.dtype != tensor.dtype or out.shape != tensor.shape:
            raise ValueError(f"all_reduce: out ({tuple(out.shape)}, {out.dtype}) must match tensor "
                             f"({tuple(tensor.shape)}, {tensor.dtype})")
        if not (tensor.is_contiguous() and out.is_contiguous()):
            raise ValueError("all_reduce: tensor and out must be contiguous (call .contiguous())")
        if tensor.numel():
            self._comm.all_reduce(tensor.data_ptr(), out.data_ptr(), tensor.numel(), code, torch.cuda.current_stream(self.device).cuda_stream)
        return out

    def destroy(self) -> None:
        self._comm.destroy()
