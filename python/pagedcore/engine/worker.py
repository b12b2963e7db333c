"""Worker: what runs the model for the engine, and InProcessWorker, the one that runs it here.

The engine reaches the model only through this interface and plain values (a StepInput in, logits
out, byte counts back), so process or Ray workers for tensor and pipeline parallelism can later
stand behind it without the step loop changing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch

from pagedcore.engine import kv_cache as kvc
from pagedcore.engine.model_runner import ModelRunner
from pagedcore.engine.step_input import StepInput
from pagedcore.sampling.logit_edits import LogitEdits
from pagedcore.sampling.logprobs import RawLogitRows
from pagedcore.sampling.row_sampling import RowSampling


@dataclass(frozen=True)
class MemoryProfile:
    """A worker's device memory around a profiled forward of the largest step."""
    total_bytes: int        # the device's memory
    peak_bytes: int         # weights + activations + logits at the peak (the scratch KV cache left out)


@dataclass(frozen=True)
class MemoryReport:
    """What a worker holds once set up."""
    weight_bytes: int       # parameters and buffers of the model
    kv_cache_bytes: int     # the device KV cache
    swap_bytes: int         # the host swap pool (0 without swap space)
    # Speculative decoding's draft model (spec_decode/draft_model.py; 0 without one), on the same
    # budget: its weights, its KV cache (its share of every block id + its scratch) and swap pool.
    draft_weight_bytes: int = 0
    draft_kv_cache_bytes: int = 0
    draft_swap_bytes: int = 0


class Worker(ABC):
    """Holds the model's weights and KV cache on one device and runs one step at a time.

    Order of calls: load_model, profile_memory (GPU only: sizes the cache), init_kv_cache, then
    execute_step once per engine step."""

    @abstractmethod
    def load_model(self) -> None:
        """Puts the weights on the worker's device."""

    @abstractmethod
    def profile_memory(self, spec: kvc.KVCacheSpec, shape: kvc.ProfileShape) -> MemoryProfile:
        """Runs a dummy forward of the given shape through a scratch KV cache and reports the peak."""

    @abstractmethod
    def init_kv_cache(self, spec: kvc.KVCacheSpec, num_blocks: int, num_cpu_blocks: int,
                      background_commit: bool = False) -> None:
        """Allocates the device KV cache (num_blocks) and the host swap pool (num_cpu_blocks, may be 0);
        background_commit: host memory is committed on a thread (kv_cache.allocate)."""

    @abstractmethod
    def execute_step(self, step: StepInput) -> torch.Tensor:
        """Block moves, then the forward. Returns fp32 logits [num_logits_rows, vocab] (step.logits_indices)."""

    def execute_fused_step(self, step: StepInput, sampling: RowSampling | None = None,
                           edits: LogitEdits | None = None, raw: RawLogitRows | None = None) -> np.ndarray | None:
        """For a step whose sampled rows are all plain (the engine checked): block moves, the forward
        and each row's token (argmax; drawn with sampling's inputs when given; after edits' penalties,
        bias and bans when given; raw's rows copied into raw.out before any edit) in one go -> int64
        [len(step.logits_indices)]; or None, having run nothing and drawn no noise, where the worker
        has no such path (the engine then calls execute_step and samples)."""
        return None

    def execute_multi_step(self, step: StepInput, sampling: RowSampling | None = None,
                           edits: LogitEdits | None = None, ban_steps: np.ndarray | None = None,
                           raw=None) -> np.ndarray | None:
        """For a step whose sequences are plain decodes followed by placeholder slots (engine/multi_step.py):
        block moves, then one decode step per slot, each sequence's token feeding its next -> int64
        [step.num_tokens], token query_start_loc[s] + i sequence s's step i: its argmax, or drawn with
        sampling's row s (a row a sequence; each step's noise drawn as a single step draws it), after
        edits' penalties, bias and bans (the first step's, advanced by the tokens chosen; ban_steps int32
        [num_seqs]); raw (engine/multi_step.py RawRows): the flagged sequences' logits before any edit
        copied into raw.out (logprobs); or None, having run nothing and drawn no noise, where the worker
        has no such path."""
        return None

    def can_multi_step(self) -> bool:
        """Whether execute_multi_step runs steps here (checked once, at engine start)."""
        return False

    @abstractmethod
    def memory_report(self) -> MemoryReport:
        """Bytes held: weights, KV cache, swap pool."""


class InProcessWorker(Worker):
    """The model in this process, driven through a ModelRunner."""

    def __init__(self, model: torch.nn.Module, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.runner = ModelRunner(model, self.device)

    @property
    def model(self) -> torch.nn.Module:
        return self.runner.model

    def load_model(self) -> None:
        # The loader builds the model on the host; a CPU model is used where it is.
        if self.device.type == "cuda":
            from pagedcore.layers.held_weights import widen_held_weights

            widen_held_weights(self.runner.model)  # the GPU's GEMMs take fp32 weights under fp32 activations
            self.runner.model.to(self.device)

    def profile_memory(self, spec: kvc.KVCacheSpec, shape: kvc.ProfileShape) -> MemoryProfile:
        if self.device.type != "cuda":
            raise ValueError(f"memory profiling measures a CUDA device, this worker runs on {self.device}")
        device = self.device
        scratch = kvc.allocate(spec, shape.num_blocks(spec.block_size), device)
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        self.runner.profile_forward(scratch, shape.num_tokens, shape.num_seqs, shape.seq_len, shape.num_logits_rows)
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - scratch.numel() * scratch.element_size()
        del scratch
        torch.cuda.empty_cache()
        _, total = torch.cuda.mem_get_info(device)
        return MemoryProfile(total_bytes=total, peak_bytes=peak)

    def init_kv_cache(self, spec: kvc.KVCacheSpec, num_blocks: int, num_cpu_blocks: int,
                      background_commit: bool = False) -> None:
        kv_cache = kvc.allocate(spec, num_blocks, self.device, background_commit=background_commit)
        # Pinned on a GPU machine, so swaps are asynchronous copies.
        cpu_kv_cache = (kvc.allocate(spec, num_cpu_blocks, "cpu", pin_memory=self.device.type == "cuda",
                                     background_commit=background_commit)
                        if num_cpu_blocks else None)
        self.runner.bind_kv_cache(kv_cache, cpu_kv_cache)

    def execute_step(self, step: StepInput) -> torch.Tensor:
        return self.runner.execute(step)

    def execute_fused_step(self, step: StepInput, sampling: RowSampling | None = None,
                           edits: LogitEdits | None = None, raw: RawLogitRows | None = None) -> np.ndarray | None:
        return self.runner.execute_fused(step, sampling, edits, raw)

    def execute_multi_step(self, step: StepInput, sampling: RowSampling | None = None,
                           edits: LogitEdits | None = None, ban_steps: np.ndarray | None = None,
                           raw=None) -> np.ndarray | None:
        return self.runner.execute_multi_step(step, sampling, edits, ban_steps, raw)

    def can_multi_step(self) -> bool:
        return self.runner.can_multi_step()

    def memory_report(self) -> MemoryReport:
        model = self.runner.model
        weight_bytes = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
        return MemoryReport(weight_bytes=weight_bytes, kv_cache_bytes=_nbytes(self.runner.kv_cache),
                            swap_bytes=_nbytes(self.runner.cpu_kv_cache))


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()
