"""The NCCL all-reduce behind the Communicator interface (distributed/nccl_communicator.py), as the
tensor-parallel model uses it: one rank in-process; two ranks on two GPUs in two processes (sums
equal to the reference: fp32 exact for integer-valued data, bf16 rounded once, odd sizes, many calls)."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.conftest import requires_cuda

pytestmark = [pytest.mark.gpu, requires_cuda]


def test_one_rank_adapter_is_the_identity_and_closes():
    from pagedcore.distributed import comm_spec as cs

    spec = cs.create_nccl_group(world_size=1)
    comm = cs.open_communicator(spec, 0, device=torch.device("cuda", 0))
    x = torch.randn(577, device="cuda")
    want = x.clone()
    comm.all_reduce(x)
    torch.cuda.synchronize()
    assert torch.equal(x, want) and comm.world_size == 1 and comm.rank == 0
    comm.close()
    comm.close()   # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        comm.all_reduce(x)


def _rank_main(spec, rank):
    from pagedcore.distributed import comm_spec as cs

    torch.cuda.set_device(rank)
    comm = cs.open_communicator(spec, rank, device=torch.device("cuda", rank))
    for seed, numel in enumerate([1, 7, 576, 64 * 576 + 3, 1 << 20]):
        gen = torch.Generator().manual_seed(seed)
        ints = [torch.randint(-1000, 1000, (numel,), generator=gen).float() for _ in range(2)]
        x = ints[rank].cuda()
        comm.all_reduce(x)
        assert torch.equal(x.cpu(), ints[0] + ints[1]), numel
        halves = [torch.randn(numel, generator=gen).to(torch.bfloat16) for _ in range(2)]
        y = halves[rank].cuda()
        comm.all_reduce(y)
        assert torch.equal(y.cpu(), (halves[0].float() + halves[1].float()).to(torch.bfloat16)), numel
    for call in range(200):
        z = torch.full((1 + call % 97, 576), float(call + rank), device="cuda")
        comm.all_reduce(z)
        assert torch.equal(z, torch.full_like(z, float(2 * call + 1)))
    torch.cuda.synchronize()
    comm.close()


@pytest.mark.multi_gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_ranks_all_reduce_through_the_adapter():
    from pagedcore.distributed import comm_spec as cs
    from tests.distributed.comm_helpers import join_ok, spawned

    spec = cs.create_nccl_group(world_size=2)
    with spawned(_rank_main, (spec, 0), (spec, 1)) as procs:
        join_ok(procs, timeout=300)
