"""The NCCL communicator: one rank in-process; two ranks in two processes when two GPUs are there."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.conftest import requires_cuda

pytestmark = [pytest.mark.gpu, requires_cuda]


@pytest.fixture(scope="module")
def comm():
    from pagedcore.ops.nccl import NcclCommunicator

    c = NcclCommunicator(1, 0, NcclCommunicator.get_unique_id(), device=torch.device("cuda", 0))
    yield c
    c.destroy()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_single_rank_all_reduce_is_the_identity(comm, dtype):
    x = torch.randn(1000, 33, device="cuda").to(dtype)
    want = x.clone()
    assert comm.all_reduce(x) is x
    out = torch.empty_like(x)
    comm.all_reduce(x, out=out)
    torch.cuda.synchronize()
    assert torch.equal(x, want) and torch.equal(out, want)
    assert comm.world_size == 1 and comm.rank == 0


def test_all_reduce_misuse(comm):
    with pytest.raises(ValueError, match="CUDA tensors"):
        comm.all_reduce(torch.ones(3))
    with pytest.raises(TypeError, match="dtype"):
        comm.all_reduce(torch.ones(3, device="cuda", dtype=torch.float64))
    with pytest.raises(ValueError, match="contiguous"):
        comm.all_reduce(torch.ones(4, 4, device="cuda").t())


def test_unique_ids_differ_and_have_nccl_size():
    from pagedcore import _core
    from pagedcore.ops.nccl import NcclCommunicator, nccl_library_path

    a, b = NcclCommunicator.get_unique_id(), NcclCommunicator.get_unique_id()
    assert len(a) == 128 and a != b
    assert _core.NcclCommunicator.nccl_version(nccl_library_path()).count(".") == 2


def _rank_main(rank, world_size, uid, results):
    from pagedcore.ops.nccl import NcclCommunicator

    torch.cuda.set_device(rank)
    comm = NcclCommunicator(world_size, rank, uid, device=torch.device("cuda", rank))
    x = torch.full((4096,), float(rank + 1), device="cuda", dtype=torch.bfloat16)
    comm.all_reduce(x)
    torch.cuda.synchronize()
    results[rank] = x[:4].float().tolist()
    comm.destroy()


@pytest.mark.multi_gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_ranks_sum():
    import torch.multiprocessing as mp

    from pagedcore.ops.nccl import NcclCommunicator

    uid = NcclCommunicator.get_unique_id()
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        results = manager.dict()
        procs = [ctx.Process(target=_rank_main, args=(r, 2, uid, results)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=120)
        assert all(p.exitcode == 0 for p in procs)
        assert results[0] == results[1] == [3.0] * 4
