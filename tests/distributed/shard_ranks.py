"""Runs a model split over real processes (torch.multiprocessing spawn) through a paged KV cache, and
the same steps in one process, for tests/distributed/test_model_shard.py. Test-only.

Each rank loads its shard with load_model_shard, builds its own KV cache (its layers and KV heads)
with the same shuffled block tables as the one-process reference (PagedDriver, same seed), and runs
the reference's steps, teacher-forced (the tokens are the reference's greedy ones: a rank holds only
a slice of the vocabulary, so it cannot pick them). The tensor-parallel group is the engine's own:
the shared-memory all-reduce (distributed/comm_spec.py); pipeline activations pass on a queue, as
numpy arrays (pickled by value, as the engine's Channels carry them)."""

from __future__ import annotations

import contextlib
import dataclasses
import queue as queue_module

import torch
import torch.multiprocessing as mp

from pagedcore.distributed import comm_spec
from pagedcore.distributed.intermediate_tensors import IntermediateTensors
from pagedcore.distributed.rank import ParallelLayout

from ..models.paged_driver import PagedDriver

NUM_BLOCKS = 32
Chunks = list[tuple[int, list[int]]]  # one step: (seq_id, new token ids) per sequence, packed in order


@dataclasses.dataclass
class RankResult:
    rank: int
    logits: list  # per step, fp32 numpy [num_step_tokens, vocab slice] (last-stage ranks only)
    weight_bytes: int
    decoder_stack: str  # "" when the C++ stack runs small steps, else the reason it declines
    num_local_layers: int
    num_kv_heads: int
    weight_bytes_by_format: dict  # the rank's LoadedModel.weight_bytes ("float32", "fp8_e4m3", ...)


def chained_stage_logits(reference_model, stages, prompt: list[int], num_tokens: int) -> tuple[torch.Tensor,
                                                                                                 torch.Tensor]:
    """The pipeline stages (LoadedModels, in order) chained in this process (the wire is the same
    IntermediateTensors), teacher-forced with the one-process model's greedy tokens: (the last stage's logits of
    the prompt's last token and of each fed token [num_tokens, vocab], the reference's)."""
    tokens, expected = PagedDriver(reference_model).greedy(0, prompt, num_tokens)
    drivers = [PagedDriver(stage.model) for stage in stages]
    got = []
    with torch.inference_mode():
        for chunk in [prompt] + [[token] for token in tokens[:-1]]:
            out = None
            for stage, driver in zip(stages, drivers):
                input_ids, positions, metadata = driver.prepare([(0, chunk)])
                out = stage.model(input_ids, positions, driver.kv_cache, metadata, out)
            got.append(stages[-1].model.compute_logits(out[-1:]))
    return torch.cat(got), expected


def reference_steps(model, prompts: list[list[int]], num_decode: int, split: int) -> tuple[list[Chunks], list]:
    """One process: sequence 0's whole prompt and the first `split` tokens of sequence 1, then the rest
    of sequence 1 beside sequence 0's first decode, then decodes of both; greedy. Returns the steps
    and each step's logits (fp32 [num_step_tokens, vocab]). Runs on one thread, as the ranks do: a
    library GEMM's sum order (hence its rounding) may depend on the thread count."""
    num_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _reference_steps(model, prompts, num_decode, split)
    finally:
        torch.set_num_threads(num_threads)


def _reference_steps(model, prompts: list[list[int]], num_decode: int, split: int) -> tuple[list[Chunks], list]:
    driver = PagedDriver(model, num_blocks=NUM_BLOCKS)
    steps: list[Chunks] = [[(0, prompts[0]), (1, prompts[1][:split])]]
    all_logits = []
    for _ in range(num_decode):
        step = steps[-1]
        logits = driver.step(step)  # [num_step_tokens, vocab]
        all_logits.append(logits)
        ends = torch.tensor([len(ids) for _, ids in step]).cumsum(0) - 1
        next_ids = logits[ends].argmax(-1).tolist()
        following = [(0, [next_ids[0]])]
        following.append((1, prompts[1][split:]) if len(steps) == 1 else (1, [next_ids[1]]))
        steps.append(following)
    steps.pop()  # the last one was never run
    return steps, all_logits


def rank_main(rank: int, model: str | None, layout: ParallelLayout, steps: list[Chunks], tp_group,
              results, activations, dtype: str = "float32", quantization: str | None = None) -> None:
    """One rank: load the shard, run every step, put a RankResult (or the exception's text) on results."""
    torch.set_num_threads(1)  # two ranks on two cores
    comm = None
    try:
        from pagedcore.distributed.model_shard import load_model_shard

        info = layout.rank_info(rank)
        if tp_group is not None:  # one stage in these tests: the group is every rank
            comm = comm_spec.open_communicator(tp_group, info.tp_rank)
        loaded = load_model_shard(model, dtype, quantization, info, comm)
        shard = loaded.model
        driver = PagedDriver(shard, num_blocks=NUM_BLOCKS)  # shard.config: this rank's layers and KV heads
        logits = []
        with torch.inference_mode():
            for chunks in steps:
                input_ids, positions, metadata = driver.prepare(chunks)
                intermediate = None
                if not info.is_first_stage:
                    hidden, residual = activations[info.pp_rank - 1].get(timeout=120)
                    intermediate = IntermediateTensors(torch.from_numpy(hidden), torch.from_numpy(residual))
                out = shard(input_ids, positions, driver.kv_cache, metadata, intermediate)
                if info.is_last_stage:
                    logits.append(shard.compute_logits(out).numpy())
                else:  # numpy travels by value: no shared-memory handle that dies with this process
                    activations[info.pp_rank].put((out.hidden.numpy().copy(), out.residual.numpy().copy()))
        status = shard.decoder_stack_status
        results.put(RankResult(rank, logits, loaded.total_weight_bytes, "" if status.supported else status.reason,
                               shard.config.num_layers, shard.config.num_kv_heads, dict(loaded.weight_bytes)))
    except BaseException as error:  # noqa: BLE001 - reported to the test, which fails with it
        import traceback

        results.put((rank, f"{type(error).__name__}: {error}\n{traceback.format_exc()}"))
    finally:
        if comm is not None:
            comm.close()


def run_ranks(model: str | None, layout: ParallelLayout, steps: list[Chunks], timeout: float = 240.0,
              dtype: str = "float32", quantization: str | None = None) -> list[RankResult]:
    """Every rank of `layout` in its own spawned process, loading `model` with --dtype / --quantization; their
    results in rank order. The processes are joined, or killed, before this returns, whatever happens."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    activations = [ctx.Queue() for _ in range(layout.pp_size - 1)]
    assert layout.tp_size == 1 or layout.pp_size == 1, "one tensor-parallel group in these tests"
    tp_group = comm_spec.create_shm_group(layout.tp_size) if layout.tp_size > 1 else None
    processes = [ctx.Process(target=rank_main, daemon=True,
                             args=(rank, model, layout, steps, tp_group, results, activations, dtype, quantization))
                 for rank in range(layout.world_size)]
    with _reaped(processes, tp_group):
        for process in processes:
            process.start()
        collected = {}
        while len(collected) < layout.world_size:
            try:
                item = results.get(timeout=timeout)
            except queue_module.Empty:
                dead = [(p.pid, p.exitcode) for p in processes if not p.is_alive()]
                raise AssertionError(f"ranks answered {sorted(collected)} within {timeout} s; exited: {dead}") from None
            if isinstance(item, tuple):
                raise AssertionError(f"rank {item[0]} failed: {item[1]}")
            collected[item.rank] = item
        for process in processes:
            process.join(timeout=60)
            assert process.exitcode == 0, f"rank pid {process.pid} exited with {process.exitcode}"
    return [collected[rank] for rank in range(layout.world_size)]


@contextlib.contextmanager
def _reaped(processes, tp_group):
    try:
        yield
    finally:
        if tp_group is not None:
            comm_spec.release(tp_group)  # unlinks the segment (ends already open keep working)
        for process in processes:
            if process.pid is not None and process.is_alive():
                process.kill()
            if process.pid is not None:
                process.join(timeout=10)
